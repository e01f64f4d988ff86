"""The recommender's rules, table-driven; a property over random series (no downsize within cooldown of a
change, none before downsizeAfter, never below the window's peak plus headroom); the policy and usage formats.
The bounds no input breaks: tests/test_rightsizing_bounds.py."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.inputs.load import parse_model
from controller.rightsizing.bounds import Limits
from controller.rightsizing.histogram import DecayingHistogram
from controller.policy import PolicyError, Rightsizing, parse_duration, parse_policy
from controller.rightsizing.recommender import MIB, Change, Hold, Slo, replay
from controller.rightsizing.usage import Sample, UsageFormatError, dump_sample, parse_line, read_samples
from controller.types import Source

GiB = 1 << 30
FAST = Rightsizing(policy="Recommend", upsize_after_s=60, downsize_after_s=3600, cooldown_s=1800)


def series(n: int, interval: float = 15.0, start: float = 0.0, **fields):
    """n samples; each field is a constant or a function of the sample index."""
    out = []
    for i in range(n):
        values = {k: (v(i) if callable(v) else v) for k, v in fields.items()}
        out.append(Sample(time=start + i * interval, model="llm/chat", **values))
    return out


def steady(n, interval=15.0, start=0.0, **extra):
    base = dict(device_bytes=3 * GiB, kv_used_bytes=GiB // 4, kv_reserved_bytes=GiB)
    return series(n, interval, start, **(base | extra))


def mib_ceil(x: float) -> int:
    return math.ceil(x / MIB) * MIB


HELPS = Limits(latency_helps=True, latency_why="more resident layers lower its predicted TPOT")


# (id, samples, policy, slo, budget, expected [(kind, direction or reason, at, to_bytes or None)])
CASES = [
    ("kv-near-its-fixed-reservation-held-for-upsizeAfter-holds-once",  # contextTokens x concurrency fixes it
     steady(6, kv_used_bytes=int(0.95 * GiB)), FAST, Slo(), 4 * GiB, [("hold", "KvReservationFull", 60.0, None)]),
    ("breach-shorter-than-upsizeAfter-changes-nothing",
     steady(3, kv_used_bytes=int(0.95 * GiB)) + steady(5, start=45), FAST, Slo(), 4 * GiB, []),
    ("refusal-upsizes-at-once-by-the-missing-bytes-plus-headroom",
     steady(2, refusals=lambda i: 1 - i, missing_bytes=lambda i: 2 * GiB if i == 0 else 0), FAST, Slo(), 4 * GiB,
     [("up", "WorkerRefusal", 0.0, mib_ceil(4 * GiB + 2 * GiB * 1.15))]),
    ("oom-upsizes-at-once", steady(1, ooms=1), FAST, Slo(), 4 * GiB,
     [("up", "OutOfMemory", 0.0, mib_ceil(4 * GiB * 1.15))]),
    ("a-refusal-that-persists-acts-again-only-after-upsizeAfter", steady(6, refusals=1), FAST, Slo(), 4 * GiB,
     [("up", "WorkerRefusal", 0.0, mib_ceil(4 * GiB * 1.15)),
      ("up", "WorkerRefusal", 60.0, mib_ceil(mib_ceil(4 * GiB * 1.15) * 1.15))]),
    ("a-breach-under-the-old-budget-waits-for-the-upsize-to-arrive",
     steady(10, refusals=1, budget_bytes=4 * GiB), FAST, Slo(), 4 * GiB,
     [("up", "WorkerRefusal", 0.0, mib_ceil(4 * GiB * 1.15))]),
    ("ttft-over-slo-held-upsizes", steady(6, ttft_s=0.9), FAST, Slo(ttft_ms=500), 4 * GiB,
     [("up", "TtftOverSlo", 60.0, mib_ceil(4 * GiB * 1.15))]),
    ("ttft-within-slo-is-no-breach", steady(6, ttft_s=0.4), FAST, Slo(ttft_ms=500), 4 * GiB, []),
    ("tpot-over-slo-held-upsizes", steady(6, tpot_s=0.08), FAST, Slo(tpot_ms=50), 4 * GiB,
     [("up", "TpotOverSlo", 60.0, mib_ceil(4 * GiB * 1.15))]),
    ("queue-wait-growing-over-threshold-upsizes", steady(6, queue_wait_s=lambda i: 1.5 + i), FAST, Slo(), 4 * GiB,
     [("up", "QueueWaitGrowing", 60.0, mib_ceil(4 * GiB * 1.15))]),
    ("queue-wait-high-but-falling-is-no-breach", steady(6, queue_wait_s=lambda i: 9.0 - i), FAST, Slo(), 4 * GiB, []),
    ("upsize-capped-at-maxBudget", steady(6, ooms=lambda i: int(i == 0)),
     Rightsizing(policy="Auto", max_budget=4 * GiB + 100 * MIB), Slo(), 4 * GiB,
     [("up", "OutOfMemory", 0.0, 4 * GiB + 100 * MIB)]),
    ("breach-at-maxBudget-holds-and-says-so", steady(6, ooms=1), Rightsizing(policy="Auto", max_budget=4 * GiB),
     Slo(), 4 * GiB, [("hold", "AtMaxBudget", 0.0, None)]),
    ("over-provisioned-downsizes-once-after-downsizeAfter",
     steady(121, interval=60, device_bytes=2 * GiB), FAST, Slo(), 8 * GiB,
     [("down", "BelowTarget", 3600.0, None)]),
    ("downsize-stops-at-minBudget", steady(121, interval=60, device_bytes=2 * GiB),
     Rightsizing(policy="Auto", min_budget=5 * GiB, downsize_after_s=3600, cooldown_s=0), Slo(), 8 * GiB,
     [("down", "BelowTarget", 3600.0, 5 * GiB)]),
    ("target-within-the-margin-is-no-downsize", steady(121, interval=60, device_bytes=3 * GiB), FAST, Slo(),
     3 * GiB + 300 * MIB, []),
    ("missing-data-holds-once-and-changes-nothing",
     series(10, device_bytes=None, ooms=1), FAST, Slo(), 4 * GiB, [("hold", "UsageMissing", 0.0, None)]),
    ("gap-restarts-the-breach-run",
     steady(4, kv_used_bytes=GiB) + steady(4, start=400, kv_used_bytes=GiB), FAST, Slo(), 4 * GiB,
     [("hold", "UsageMissing", 400.0, None)]),
]


@pytest.mark.parametrize("samples,policy,slo,budget,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_recommender_rules(samples, policy, slo, budget, expected):
    events, _ = replay(samples, "llm/chat", budget, policy, slo, limits=HELPS)
    got = []
    for e in events:
        if isinstance(e, Change):
            got.append((e.direction, e.reason, e.at, e.to_bytes))
        else:
            got.append(("hold", e.reason, e.at, None))
    assert [g[:3] for g in got] == [x[:3] for x in expected]
    for g, x in zip(got, expected):
        if x[3] is not None:
            assert g[3] == x[3]


def test_downsize_target_is_never_below_the_peak_plus_headroom_and_carries_evidence():
    samples = steady(121, interval=60, device_bytes=lambda i: 2 * GiB if i % 10 else 2 * GiB + 300 * MIB)
    events, _ = replay(samples, "llm/chat", 8 * GiB, FAST)
    (change,) = events
    peak, kv = 2 * GiB + 300 * MIB, GiB // 4
    assert change.to_bytes == mib_ceil(peak * 1.15)
    assert change.evidence.peak_bytes == peak and change.evidence.samples == 61
    assert change.evidence.kv_used_peak_bytes == kv
    assert change.evidence.as_dict()["windowSeconds"] == 3600


def test_without_kv_usage_headroom_applies_to_the_whole_peak():
    samples = series(121, interval=60, device_bytes=2 * GiB)
    events, _ = replay(samples, "llm/chat", 8 * GiB, FAST)
    (change,) = events
    assert 2 * GiB * 1.15 <= change.to_bytes <= 2 * GiB * 1.05 * 1.15 + MIB


def test_no_downsize_within_cooldown_of_an_upsize():
    policy = Rightsizing(policy="Auto", upsize_after_s=60, downsize_after_s=600, cooldown_s=7200)
    samples = steady(1, ooms=1) + steady(400, interval=60, start=60, device_bytes=GiB)
    events, _ = replay(samples, "llm/chat", 8 * GiB, policy)
    assert [(e.direction, e.at) for e in events] == [("up", 0.0), ("down", 7200.0)]


# --- property -------------------------------------------------------------------------------------------

@st.composite
def usage_series(draw):
    n = draw(st.integers(5, 150))
    times, t = [], 0.0
    for _ in range(n):
        t += draw(st.sampled_from([15.0, 15.0, 15.0, 60.0, 600.0]))
        times.append(t)
    samples = []
    for at in times:
        missing = draw(st.integers(0, 30)) == 0
        device = draw(st.integers(GiB // 2, 6 * GiB))
        samples.append(Sample(
            time=at, model="llm/chat", device_bytes=None if missing else device,
            kv_used_bytes=draw(st.integers(0, GiB // 2)), kv_reserved_bytes=GiB,
            ooms=int(draw(st.integers(0, 40)) == 0), refusals=0,
            tpot_s=draw(st.sampled_from([0.01, 0.02, 0.2]))))
    policy = Rightsizing(policy="Auto", headroom_percent=draw(st.sampled_from([0.0, 15.0, 50.0])),
                         upsize_after_s=draw(st.sampled_from([15, 60, 300])),
                         downsize_after_s=draw(st.sampled_from([60, 600, 1800])),
                         cooldown_s=draw(st.sampled_from([0, 300, 3600])))
    return samples, policy, draw(st.integers(GiB, 12 * GiB))


@settings(max_examples=150, deadline=None)
@given(usage_series())
def test_downsizes_wait_for_cooldown_and_downsizeAfter_and_keep_the_peak_plus_headroom(case):
    samples, policy, budget = case
    events, _ = replay(samples, "llm/chat", budget, policy, Slo(tpot_ms=100))
    first = next(s.time for s in samples if not s.missing) if any(not s.missing for s in samples) else 0
    last_change = None
    for e in events:
        if isinstance(e, Hold):
            continue
        if e.direction == "down":
            assert e.at - first >= policy.downsize_after_s
            if last_change is not None:
                assert e.at - last_change >= policy.cooldown_s
            window = [s for s in samples if not s.missing and e.at - policy.downsize_after_s <= s.time <= e.at]
            peak = max(s.device_bytes for s in window)
            rest, kv = max(s.device_bytes - s.kv_used_bytes for s in window), max(s.kv_used_bytes for s in window)
            headroom = 1 + policy.headroom_percent / 100
            assert e.to_bytes >= peak * headroom and e.to_bytes >= rest + kv * headroom
            assert e.to_bytes < e.from_bytes
        else:
            assert e.to_bytes > e.from_bytes
        last_change = e.at


# --- histogram, policy, usage format --------------------------------------------------------------------

def test_decaying_histogram_forgets_old_usage_by_half_life():
    h = DecayingHistogram(half_life_s=3600)
    for i in range(100):
        h.add(8 * GiB, i)
    for i in range(100):
        h.add(GiB, 10 * 3600 + i)  # ten half-lives later: old weight is ~1/1000 of the new
    assert h.percentile(0.99) < 1.06 * GiB
    assert h.percentile(1.0) >= 8 * GiB


@pytest.mark.parametrize("text,seconds", [("90s", 90), ("5m", 300), ("6h", 21600), ("1d", 86400)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


def test_policy_defaults_are_documented_values():
    assert parse_policy(None).policy == "Off"
    p = parse_policy({})
    assert (p.policy, p.headroom_percent, p.upsize_after_s, p.downsize_after_s, p.cooldown_s) == (
        "Recommend", 15.0, 60, 86400, 21600)


def _model(rightsizing):
    return {"apiVersion": "gpushare.dev/v1alpha1", "kind": "ElasticModel", "metadata": {"name": "chat"},
            "spec": {"model": "org/chat", "memoryBudget": "4Gi", "rightsizing": rightsizing}}


def test_loader_parses_rightsizing():
    model, errors = parse_model(_model({"policy": "Auto", "minBudget": "2Gi", "maxBudget": "8Gi",
                                        "downsizeAfter": "2d", "cooldown": "12h"}), Source("models/a.yaml"))
    assert errors == []
    assert model.rightsizing == Rightsizing(policy="Auto", min_budget=2 * GiB, max_budget=8 * GiB,
                                            downsize_after_s=172800, cooldown_s=43200)


@pytest.mark.parametrize("rightsizing,reason", [
    ({"policy": "Sometimes"}, "InvalidValue"),
    ({"cooldown": "6 hours"}, "InvalidSpec"),
    ({"minBudget": "8Gi", "maxBudget": "2Gi"}, "InvalidRightsizing"),
    ({"headroomPercent": -5}, "InvalidSpec"),
], ids=["unknown-policy", "bad-duration", "min-above-max", "negative-headroom"])
def test_loader_rejects_bad_rightsizing(rightsizing, reason):
    model, errors = parse_model(_model(rightsizing), Source("models/a.yaml"))
    assert model is None and [e.reason for e in errors] == [reason]
    assert errors[0].path.startswith("spec.rightsizing")


def test_usage_lines_round_trip_and_bad_lines_are_named():
    line = ('{"time":"2026-11-30T12:00:15Z","model":"llm/chat","deviceBytes":1503238553,"kvUsedBytes":5,'
            '"ttftSeconds":0.12}')
    sample = parse_line(line)
    assert sample.time == 1796040015.0 and sample.device_bytes == 1503238553 and sample.queue_wait_s is None
    assert dump_sample(sample) == line
    with pytest.raises(UsageFormatError, match=r"usage.jsonl:2: deviceBytes must be a finite number"):
        read_samples([line, '{"time":1,"model":"llm/chat","deviceBytes":-1}'], "usage.jsonl")
    with pytest.raises(UsageFormatError, match="unknown fields colour"):
        parse_line('{"time":1,"model":"llm/chat","colour":1}')
