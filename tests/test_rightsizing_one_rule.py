"""One rule for the loop and the replay: a replay over any series gives the budgets the installed loop gives, run
pass by pass over the same samples.

The loop is the real pass: every `INTERVAL` the reader (controller.rightsizing.prometheus.read_usage) reads its
window from a Prometheus that answers from the trace (the slots' peaks as `max_over_time` over each slot, the grid
as the trace's samples), the step (controller.rightsizing.step.step) decides, and its records are dumped and read
back (controller.inputs.rightsizing_records.records_from, from bytes), as git carries them to the next pass. The
replay is `replay` over every sample at once. Property-tested over generated traces (levels, declines, breaches of
every kind, gaps) and windows (kept per second, and in half-hour slots); a window the loop cannot keep is refused.
"""
from __future__ import annotations

import json
import math
import urllib.parse
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.cli.commands import main
from controller.inputs.rightsizing_records import records_from
from controller.policy import Rightsizing
from controller.rightsizing.bounds import limits_for
from controller.rightsizing.prometheus import DETAIL_S, history_queries, namespaces_query, queries, read_usage
from controller.rightsizing.recommender import Change, Slo, replay
from controller.rightsizing.step import step
from controller.rightsizing.usage import Sample, by_model, format_time, parse_time
from controller.rightsizing.window import SLOT_S, WindowError, slot_for
from controller.types import Decision
from factories import PRODUCT, toy_model, toy_profile, toy_slot

MiB, GiB = 1 << 20, 1 << 30
STEP = 60
INTERVAL = 300
T0 = 1_800_000_000 - 1_800_000_000 % SLOT_S  # a slot boundary
PROFILE = toy_profile(layer_bytes=100 * MiB, embedding=100 * MiB, head=100 * MiB, kv_per_token=4096)  # 1.2 GiB
GAUGES = {"deviceBytes": "device_bytes", "kvUsedBytes": "kv_used_bytes", "kvReservedBytes": "kv_reserved_bytes",
          "queueWaitSeconds": "queue_wait_s", "ttftSeconds": "ttft_s", "tpotSeconds": "tpot_s",
          "refusals": "refusals", "missingBytes": "missing_bytes", "budgetBytes": "budget_bytes", "ooms": "ooms"}


def prometheus(samples: list[Sample]):
    """A fetch answering the reader's queries from the trace: each grid point holds the sample at that time, and
    each slot end T the peaks (and the least KV in use) of the samples in (T - slot, T]."""
    by_time = {s.time: s for s in samples if not s.missing}
    fields = {promql: field for field, promql in queries(STEP).items()}
    slots = {promql: field for field, promql in history_queries().items()}

    def value(field: str, at: float, slot: bool):
        if not slot:
            s = by_time.get(at)
            return None if s is None else getattr(s, GAUGES[field])
        inside = [s for t, s in by_time.items() if at - SLOT_S < t <= at]
        if not inside:
            return None
        if field == "deviceBytes":
            return max(s.device_bytes for s in inside)
        kv = [min(s.kv_used_bytes, s.device_bytes) for s in inside if s.kv_used_bytes is not None]
        return None if not kv else max(kv) if field == "kvUsedBytes" else min(kv)

    def fetch(url: str, deadline_s: float) -> bytes:
        params = dict(urllib.parse.parse_qsl(url.split("?", 1)[1]))
        if params["query"].startswith(namespaces_query(0)[:50]):  # each (model, worker)'s namespace
            result = [{"metric": {"namespace": "llm", "model": "chat", "instance": "w:9400"},
                       "values": [[float(params["start"]), "1"]]}]
            return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}).encode()
        slot = params["query"] in slots
        field = slots[params["query"]] if slot else fields[params["query"]]
        start, end, step_s = float(params["start"]), float(params["end"]), int(params["step"])
        points = []
        for i in range(int((end - start) // step_s) + 1):
            v = value(field, start + i * step_s, slot)
            if v is not None:
                points.append([start + i * step_s, str(v)])
        labels = {"model": "chat", "instance": "w:9400"} | ({} if slot else {"namespace": "llm"})  # as Prometheus
        result = [{"metric": labels, "values": points}] if points else []
        return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}).encode()
    return fetch


@st.composite
def traces(draw):
    """Segments of a minute grid: a level (or a steady decline), KV in use, a breach of some kind, or a gap."""
    samples, t, kv_reported = [], T0, draw(st.booleans())
    for _ in range(draw(st.integers(2, 7))):
        minutes = draw(st.sampled_from([20, 45, 90, 240]))
        start_mib = draw(st.integers(300, 1400))
        end_mib = draw(st.sampled_from([start_mib, start_mib // 2, start_mib + 200]))
        kind = draw(st.sampled_from(["quiet", "quiet", "oom", "refusal", "tpot", "ttft", "kv", "gap"]))
        for i in range(minutes):
            t += STEP
            if kind == "gap" and draw(st.booleans()):
                continue  # a run of the grid without usage (both whole minutes and whole segments)
            device = int((start_mib + (end_mib - start_mib) * i / minutes) * MiB)
            samples.append(Sample(
                time=float(t), model="llm/chat", device_bytes=device,
                kv_used_bytes=None if not kv_reported else device // 10 if kind != "kv" else 95 * MiB,
                kv_reserved_bytes=100 * MiB if kv_reported else None, ooms=int(kind == "oom" and i == minutes // 2),
                refusals=int(kind == "refusal" and i == 3), missing_bytes=200 * MiB if kind == "refusal" else None,
                tpot_s=0.2 if kind == "tpot" else 0.01, ttft_s=2.0 if kind == "ttft" else 0.1))
    policy = Rightsizing(policy="Auto", headroom_percent=15, upsize_after_s=draw(st.sampled_from([60, 300, 900])),
                         downsize_after_s=draw(st.sampled_from([600, 1800, 3600, 7200])),
                         cooldown_s=draw(st.sampled_from([0, 900, 1300, 2500, 3600])))
    window = draw(st.sampled_from([1200, 3600, 7200, 10800]))  # per second (under half an hour), or in slots
    jitter = draw(st.lists(st.integers(-30, 30), min_size=1, max_size=8))  # the loop's ±10 % around its interval
    return samples, policy, window, draw(st.integers(600, 1300)) * MiB, jitter


def _decision(budget: int) -> Decision:
    """chat elastic with 3 of 10 layers on the GPU: more bytes lower its predicted TPOT (latency helps)."""
    return Decision(name="chat", namespace="llm", model="org/toy", gpu_product=PRODUCT, slot="node-a/gpu0",
                    mode="elastic", resident_layers=3, total_layers=10, need_bytes=1300 * MiB, budget_bytes=budget,
                    footprint_bytes=budget, predicted=None, slo_met=None, reason="", reason_code="")


def loop_pass_by_pass(samples, policy, window, budget, jitter=(0,)):
    """The installed loop over the trace: (pass time, budget in force after it, its last change) for every pass,
    due every INTERVAL plus the next of `jitter`."""
    model = replace(toy_model("chat", budget, tpot_ms=50, ttft_ms=500), rightsizing=policy)
    fetch, records, out = prometheus(samples), {}, []
    slots, decisions = [toy_slot("node-a", 1 << 40)], [_decision(budget)]
    end, now, turn = samples[-1].time + STEP, int(samples[0].time) + STEP, 0
    while now <= end:
        usage = read_usage("http://prometheus:9090", now - window, now, STEP, fetch,
                           fleet={model.ref: policy.upsize_after_s}, detail_s=INTERVAL + DETAIL_S)
        result = step([model], decisions, slots, records, by_model(usage), float(now), profiles=[PROFILE],
                      window_s=window, step_s=usage.step_s, history_until=usage.history_until,
                      acts_after=usage.acts_after)
        # as git carries them: the records' bytes, read back by the one reader
        records = dict(records_from({r.path: r.dump().encode() for r in result.records.values()}))
        record = records[("llm", "chat")]
        out.append((now, record.budget_bytes, record.at))
        now, turn = now + INTERVAL + jitter[turn % len(jitter)], turn + 1
    return out, model, decisions, slots


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traces())
def test_a_replay_of_the_samples_gives_the_budgets_the_loop_gives_pass_by_pass(case):
    samples, policy, window, budget, jitter = case
    if len(samples) < 2:
        return
    passes, model, decisions, slots = loop_pass_by_pass(samples, policy, window, budget, jitter)
    limits = limits_for(model, policy, decisions[0], slots, PROFILE)
    events, _ = replay(samples, model.ref, budget, policy, Slo(ttft_ms=500, tpot_ms=50), limits=limits,
                       window_s=window, step_s=STEP)
    changes = [e for e in events if isinstance(e, Change)]
    for now, in_force, at in passes:
        seen = [c for c in changes if c.at <= math.floor(now / STEP) * STEP - STEP]  # what that pass could read
        assert in_force == (seen[-1].to_bytes if seen else budget), (now, [(c.at, c.to_bytes) for c in changes])


@pytest.mark.parametrize("cooldown_s", range(3000, 3600, 60))
def test_a_downsize_a_cooldown_times_anywhere_in_a_slot_lands_when_the_replays_does(cooldown_s):
    """Every sample a pass acts on sees a window's worth of usage before it, as the replay does: usage steps down
    twice in a series longer than the window, and the second downsize waits for the cooldown, whose end falls
    anywhere in a half hour (a pass whose history began a slot later could not see the window covered there)."""
    level = lambda i: 1200 if i < 300 else 1000 if i < 310 else 800  # noqa: E731
    samples = [Sample(time=float(T0 + STEP * i), model="llm/chat", device_bytes=level(i) * MiB,
                      kv_used_bytes=10 * MiB, kv_reserved_bytes=100 * MiB) for i in range(1, 560)]
    policy = Rightsizing(policy="Auto", upsize_after_s=60, downsize_after_s=3600, cooldown_s=cooldown_s)
    passes, model, decisions, slots = loop_pass_by_pass(samples, policy, 3600, 1300 * MiB)
    limits = limits_for(model, policy, decisions[0], slots, PROFILE)
    events, _ = replay(samples, model.ref, 1300 * MiB, policy, Slo(ttft_ms=500, tpot_ms=50), limits=limits,
                       window_s=3600, step_s=STEP)
    changes = [e for e in events if isinstance(e, Change)]
    assert len(changes) == 2 and changes[1].at - changes[0].at == cooldown_s
    assert sorted({at for _, _, at in passes if at}) == [format_time(c.at) for c in changes]


def _trace_decline(days: int = 6) -> list[Sample]:
    return [Sample(time=float(T0 + i * STEP), model="llm/chat",
                   device_bytes=int((28 - 8 * i * STEP / (days * 86400)) * GiB)) for i in range(days * 86400 // STEP)]


def test_the_same_rule_over_days_with_the_installed_window():
    """The issue's trace, pass by pass every 5 minutes over 6 days, against one replay: the same budgets."""
    samples = _trace_decline()
    policy = Rightsizing(policy="Auto")
    model = replace(toy_model("chat", 36 * GiB), rightsizing=policy)
    fetch, records, budgets = prometheus(samples), {}, []
    for now in range(int(samples[0].time) + 86400, int(samples[-1].time) + STEP + 1, 4 * 3600):  # every 4 h
        usage = read_usage("http://prometheus:9090", now - 2 * 86400, now, STEP, fetch,
                           fleet={model.ref: policy.upsize_after_s}, detail_s=4 * 3600 + DETAIL_S)
        result = step([model], (), [], records, by_model(usage), float(now), window_s=2 * 86400, step_s=STEP,
                      history_until=usage.history_until, acts_after=usage.acts_after)
        records = dict(records_from({r.path: r.dump().encode() for r in result.records.values()}))
        budgets.append((now, records[("llm", "chat")].budget_bytes))
    events, _ = replay(samples, model.ref, 36 * GiB, policy, window_s=2 * 86400, step_s=STEP)
    changes = [e for e in events if isinstance(e, Change)]
    for now, in_force in budgets:
        seen = [c for c in changes if c.at < now - STEP]
        assert in_force == (seen[-1].to_bytes if seen else 36 * GiB)
    assert len(changes) >= 3 and budgets[-1][1] == changes[-1].to_bytes


@pytest.mark.parametrize("window,step_s,words", [
    (45 * 3600 + 600, None, "not a whole number of half hours"),
    (15 * 86400, None, "longer than the loop keeps"),
    (2 * 86400, 7, "does not divide the half-hour slot"),
    (0.5, None, "not a whole number of seconds"),
    (0, None, "no duration"),
], ids=["not-whole-half-hours", "beyond-two-weeks", "grid-that-does-not-divide-a-slot", "fraction-of-a-second",
        "zero"])
def test_a_window_the_loop_cannot_keep_is_refused_with_what_to_pass(window, step_s, words):
    with pytest.raises(WindowError) as caught:
        slot_for(window, step_s)
    assert words in str(caught.value) and "pass" in str(caught.value)


def test_windows_the_loop_keeps():
    assert [slot_for(w) for w in (30, 1799, 1800, 2 * 86400, 6 * 86400, 14 * 86400)] == [1, 1, SLOT_S, SLOT_S,
                                                                                        SLOT_S, SLOT_S]


def test_rightsize_refuses_a_window_it_cannot_replay_as_the_loop_would(tmp_path, capsys):
    repo = tmp_path / "repo"
    (repo / "models").mkdir(parents=True)
    usage = tmp_path / "usage.jsonl"
    usage.write_text('{"time":1,"model":"llm/chat","deviceBytes":5}\n')
    assert main(["rightsize", "--repo", str(repo), "--usage", str(usage), "--window", "2710m"]) == 2
    err = capsys.readouterr().err
    assert "--window: a window of 2710m is not a whole number of half hours" in err and "pass 45h or 45.5h" in err


def test_the_installed_loop_refuses_a_window_it_cannot_keep_before_touching_git(tmp_path, capsys):
    code = main(["reconcile", "--offline", "--repo", str(tmp_path / "nowhere"), "--once", "--prometheus",
                 "http://127.0.0.1:1", "--rightsize-window", "100m"])
    assert code == 2
    err = capsys.readouterr().err
    assert "[WindowInvalid]" in err and "--rightsize-window 6000s" in err and "half hours" in err


OLD_RECORD = """\
apiVersion: gpushare.dev/v1alpha1
kind: RightsizingRecord
model:
  namespace: llm
  name: chat
policy: Auto
specBudgetBytes: 38654705664
budgetBytes: 32346082304
direction: down
reason: BelowTarget
at: '2027-01-15T08:00:00Z'
evidence:
  percentile: 0.99
  percentileBytes: 30065198980
  peakBytes: 28126420992
  windowSeconds: 172800
  halfLifeSeconds: 86400
  headroomPercent: 15.0
  samples: 2880
  breaches: []
recentChanges:
- '2027-01-15T08:00:00Z'
conditions:
- type: UsageAvailable
  status: 'True'
  reason: UsageRead
  message: usage read over the window
"""


def test_a_record_written_before_this_rule_is_read_and_the_loop_carries_on_from_it():
    """Records keep their format: a record of the earlier loop is read as it is, and the next pass starts from its
    budget, its last change (the cooldown counts from it) and its changes of the day."""
    records = records_from({"decisions/rightsizing/llm/chat.yaml": OLD_RECORD.encode()})
    assert not records.problems
    record = records[("llm", "chat")]
    model = replace(toy_model("chat", 36 * GiB), rightsizing=Rightsizing(policy="Auto"))
    last = 1_800_000_000.0  # 2027-01-15T08:00:00Z, the record's change
    samples = [Sample(time=last - 2 * 86400 + STEP * i, model="llm/chat", device_bytes=20 * GiB)
               for i in range(1, 2 * 86400 // STEP + 3 * 3600 // STEP)]
    result = step([model], (), [], {record.key: record}, {"llm/chat": samples}, samples[-1].time + STEP,
                  window_s=2 * 86400, step_s=STEP)
    after = result.records[("llm", "chat")]
    assert after.budget_bytes == record.budget_bytes and after.at == record.at  # within the cooldown: it waits
    later = [Sample(time=samples[-1].time + STEP * i, model="llm/chat", device_bytes=20 * GiB) for i in range(1, 240)]
    result = step([model], (), [], {record.key: after}, {"llm/chat": samples + later}, later[-1].time + STEP,
                  window_s=2 * 86400, step_s=STEP)
    moved = result.records[("llm", "chat")]
    assert moved.budget_bytes < record.budget_bytes and moved.recent[0] == "2027-01-15T08:00:00Z"
    assert parse_time(moved.at) - last >= Rightsizing().cooldown_s
