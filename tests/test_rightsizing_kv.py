"""The KV-cache reservation rule (controller.rightsizing.kv), table-driven: the KV in use plus headroom in whole
full-context sequences, never below one sequence, never below what the SLO's concurrency promises."""
from __future__ import annotations

from dataclasses import replace

import pytest

from controller.rightsizing.kv import recommend_kv
from controller.rightsizing.policy import Rightsizing
from controller.rightsizing.step import step
from controller.rightsizing.usage import Sample

MiB = 1 << 20
PER_TOKEN = 1024            # bytes of KV per token
CONTEXT = 2048              # tokens: one sequence is 2 MiB
SEQ = PER_TOKEN * CONTEXT

CASES = [
    # id, used p99, used peak, headroom %, planned concurrency, SLO concurrency (None: undeclared),
    # expected (sequences, change, floor sequences)
    ("idle-without-slo-keeps-one-full-context-sequence", 0, 0, 15, 1, None, (1, "keep", 1)),
    ("busy-without-slo-grows-to-the-use-plus-headroom", 3 * SEQ, 3 * SEQ, 15, 1, None, (4, "grow", 1)),
    ("headroom-that-lands-on-a-sequence-adds-none", 2 * SEQ, 2 * SEQ, 0, 1, None, (2, "grow", 1)),
    ("the-peak-counts-when-above-the-percentile", SEQ // 2, 5 * SEQ // 2, 15, 1, None, (3, "grow", 1)),
    ("the-percentile-counts-when-above-the-peak", 5 * SEQ // 2, SEQ // 2, 15, 1, None, (3, "grow", 1)),
    ("the-slo-concurrency-is-a-floor-idle-or-not", SEQ // 4, SEQ // 4, 15, 4, 4, (4, "keep", 4)),
    ("the-slo-floor-never-caps-growth", 6 * SEQ, 6 * SEQ, 15, 4, 4, (7, "grow", 4)),
    ("shrinks-only-where-no-slo-promises-the-sequences", SEQ // 4, SEQ, 15, 6, None, (2, "shrink", 1)),
    ("an-slo-of-one-sequence-is-the-one-sequence-floor", 0, 0, 15, 1, 1, (1, "keep", 1)),
]


@pytest.mark.parametrize("p99,peak,headroom,concurrency,slo_concurrency,expected", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_the_kv_reservation_rule(p99, peak, headroom, concurrency, slo_concurrency, expected):
    kv = recommend_kv(used_percentile_bytes=p99, used_peak_bytes=peak, headroom_percent=headroom,
                      kv_bytes_per_token=PER_TOKEN, context_tokens=CONTEXT, concurrency=concurrency,
                      slo_concurrency=slo_concurrency)
    sequences, change, floor = expected
    assert (kv.sequences, kv.change, kv.floor_bytes // SEQ) == (sequences, change, floor)
    assert kv.recommended_bytes == sequences * SEQ and kv.reserved_bytes == concurrency * SEQ
    assert kv.recommended_bytes >= max(peak, p99 or 0)  # never below what was in use
    assert ("slo.concurrency" in kv.floor) == (floor > 1)


def test_no_recommendation_without_the_size_of_a_sequence():
    assert recommend_kv(used_percentile_bytes=MiB, used_peak_bytes=MiB, headroom_percent=15, kv_bytes_per_token=0,
                        context_tokens=CONTEXT, concurrency=1, slo_concurrency=None) is None


def _samples(kv_used: int) -> list[Sample]:
    return [Sample(time=1000.0 + 15 * i, model="llm/chat", device_bytes=3 << 30, kv_used_bytes=kv_used,
                   kv_reserved_bytes=4 * SEQ) for i in range(20)]


def test_the_step_records_the_kv_advice_from_the_models_profile_and_none_without_one():
    from factories import toy_model, toy_profile

    profile = toy_profile("org/chat", kv_per_token=PER_TOKEN)
    model = replace(toy_model("chat", 4 << 30, model="org/chat", context=CONTEXT, concurrency=4),
                    has_slo=True, rightsizing=Rightsizing(policy="Recommend"))
    usage = {"llm/chat": _samples(4 * SEQ)}  # every sequence in use: with headroom it needs a fifth
    kv = step([model], [], [], {}, usage, 1300.0, profiles=[profile]).records[model.key].kv
    assert (kv["sequences"], kv["change"], kv["reservedBytes"]) == (5, "grow", 4 * SEQ)
    assert "slo.concurrency 4" in kv["floor"]
    assert step([model], [], [], {}, usage, 1300.0).records[model.key].kv == {}  # no profile: no advice
