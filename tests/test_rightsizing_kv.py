"""The KV-cache reservation rule (controller.rightsizing.kv), table-driven: the KV in use plus headroom in whole
full-context sequences, never below one sequence, never below what the SLO's concurrency promises."""
from __future__ import annotations

from dataclasses import replace

import pytest

from controller.rightsizing.kv import recommend_kv
from controller.policy import Rightsizing
from controller.rightsizing.step import kv_line, step
from controller.rightsizing.usage import Sample

MiB = 1 << 20
PER_TOKEN = 1024            # bytes of KV per token
CONTEXT = 2048              # tokens: one sequence is 2 MiB
SEQ = PER_TOKEN * CONTEXT

CHUNK = 512                 # tokens: one prefill chunk
CASES = [
    # id, used p99, used peak, headroom %, planned concurrency, SLO concurrency (None: no SLO),
    # expected (sequences, tokens each, change, floor tokens)
    ("idle-without-slo-shrinks-to-one-prefill-chunk", 0, 0, 15, 1, None, (1, CHUNK, "shrink", CHUNK)),
    ("light-use-without-slo-shrinks-the-context-to-whole-chunks", SEQ // 4, SEQ // 4, 15, 1, None,
     (1, 2 * CHUNK, "shrink", CHUNK)),
    ("near-a-full-sequence-without-slo-keeps-the-context", SEQ - 1024, SEQ - 1024, 0, 1, None,
     (1, CONTEXT, "keep", CHUNK)),
    ("busy-without-slo-grows-to-the-use-plus-headroom", 3 * SEQ, 3 * SEQ, 15, 1, None, (4, CONTEXT, "grow", CHUNK)),
    ("headroom-that-lands-on-a-sequence-adds-none", 2 * SEQ, 2 * SEQ, 0, 1, None, (2, CONTEXT, "grow", CHUNK)),
    ("the-peak-counts-when-above-the-percentile", SEQ // 2, 5 * SEQ // 2, 15, 1, None, (3, CONTEXT, "grow", CHUNK)),
    ("the-percentile-counts-when-above-the-peak", 5 * SEQ // 2, SEQ // 2, 15, 1, None, (3, CONTEXT, "grow", CHUNK)),
    ("the-slo-concurrency-is-a-floor-idle-or-not", SEQ // 4, SEQ // 4, 15, 4, 4, (4, CONTEXT, "keep", 4 * CONTEXT)),
    ("the-slo-floor-never-caps-growth", 6 * SEQ, 6 * SEQ, 15, 4, 4, (7, CONTEXT, "grow", 4 * CONTEXT)),
    ("shrinks-whole-sequences-where-no-slo-promises-them", SEQ // 4, SEQ, 15, 6, None, (2, CONTEXT, "shrink", CHUNK)),
    ("an-slo-of-one-sequence-keeps-its-full-context", 0, 0, 15, 1, 1, (1, CONTEXT, "keep", CONTEXT)),
]


@pytest.mark.parametrize("p99,peak,headroom,concurrency,slo_concurrency,expected", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_the_kv_reservation_rule(p99, peak, headroom, concurrency, slo_concurrency, expected):
    kv = recommend_kv(used_percentile_bytes=p99, used_peak_bytes=peak, headroom_percent=headroom,
                      kv_bytes_per_token=PER_TOKEN, context_tokens=CONTEXT, concurrency=concurrency,
                      slo_concurrency=slo_concurrency)
    sequences, tokens, change, floor_tokens = expected
    assert (kv.sequences, kv.context_tokens, kv.change, kv.floor_bytes // PER_TOKEN) == (
        sequences, tokens, change, floor_tokens)
    assert kv.recommended_bytes == sequences * tokens * PER_TOKEN and kv.reserved_bytes == concurrency * SEQ
    assert kv.recommended_bytes >= max(peak, p99 or 0)  # never below what was in use
    assert kv.recommended_bytes >= kv.floor_bytes
    assert ("slo.concurrency" in kv.floor) == (slo_concurrency is not None and slo_concurrency > 1)


def test_the_commit_line_says_which_slo_field_applies_the_advice():
    shorter = recommend_kv(used_percentile_bytes=0, used_peak_bytes=SEQ // 4, headroom_percent=15,
                           kv_bytes_per_token=PER_TOKEN, context_tokens=CONTEXT, concurrency=1, slo_concurrency=None)
    more = recommend_kv(used_percentile_bytes=0, used_peak_bytes=3 * SEQ, headroom_percent=15,
                        kv_bytes_per_token=PER_TOKEN, context_tokens=CONTEXT, concurrency=1, slo_concurrency=None)
    assert "set spec.slo.contextTokens to 1024 to apply it" in kv_line(shorter.as_dict())
    assert "set spec.slo.concurrency to 4 to apply it" in kv_line(more.as_dict())


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
