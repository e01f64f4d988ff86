"""contract.footprint: each term on round numbers, and the fast elastic scan against brute force."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.footprint import (ELASTIC_PREFILL_MAX_TOKENS, PREFILL_CHUNK_TOKENS, Terms, activation_bytes,
                                default_overhead_bytes, elastic_minimum, footprint, largest_elastic,
                                link_bytes_per_prefill_token, prefill_chunk_tokens, swap_area, terms_document,
                                terms_from_document)

TERMS = Terms(fixed_bytes=100, layer_bytes=(10, 30, 20), kv_bytes_per_token=2,
              prefill_activation_bytes_per_token=1, decode_activation_bytes_per_sequence=1000, overhead_bytes=7)


@pytest.mark.parametrize("case,context,concurrency,layers,expected", [
    ("resident-all-layers-no-buffers", 10, 1, None, 100 + 60 + 20 + 1000 + 7),
    ("elastic-one-layer-buffers-hold-the-largest-streamed", 10, 1, 1, 100 + 10 + 2 * 30 + 20 + 1000 + 7),
    ("elastic-two-layers-buffers-hold-the-last", 10, 1, 2, 100 + 40 + 2 * 20 + 20 + 1000 + 7),
    ("minimum-streams-everything", 10, 1, 0, 100 + 2 * 30 + 20 + 1000 + 7),
    ("kv-scales-with-context-and-concurrency", 100, 3, None, 100 + 60 + 600 + 3000 + 7),
    ("prefill-peak-is-bounded-by-one-chunk", 100_000, 1, None,
     100 + 60 + 200_000 + max(PREFILL_CHUNK_TOKENS, 1000) + 7),
])
def test_footprint_terms(case, context, concurrency, layers, expected):
    assert footprint(TERMS, context, concurrency, layers).total == expected, case


SHORT = Terms(fixed_bytes=0, layer_bytes=(0,), kv_bytes_per_token=0, prefill_activation_bytes_per_token=10,
              decode_activation_bytes_per_sequence=1, overhead_bytes=0)


@pytest.mark.parametrize("case,context,concurrency,tokens", [
    ("one-short-prompt-is-its-context", 100, 1, 100),
    ("several-short-prompts-share-one-step", 100, 4, 400),
    ("many-short-prompts-fill-the-chunk", 100, 8, PREFILL_CHUNK_TOKENS),
    ("long-prompts-one-chunk", 4096, 4, PREFILL_CHUNK_TOKENS),
])
def test_the_prefill_peak_counts_every_prompt_one_step_can_carry(case, context, concurrency, tokens):
    """engine.batch fills a step's chunk with the prompts of several sequences: the reservation is for the tokens
    one step can carry, the chunk or every sequence's context, whichever is fewer."""
    assert activation_bytes(SHORT, context, concurrency) == 10 * tokens, case


def streaming(per_token: int, layers=(3000,) * 4) -> Terms:
    return Terms(fixed_bytes=100, layer_bytes=layers, kv_bytes_per_token=2, prefill_activation_bytes_per_token=3,
                 decode_activation_bytes_per_sequence=10, overhead_bytes=7, stream_bytes_per_prefill_token=per_token)


@pytest.mark.parametrize("case,per_token,resident,context,chunk,activation", [
    # 4 streamed layers × 3000 bytes = 12000 bytes per stream; 12000 ÷ 5 = 2400 tokens cover it
    ("elastic-floor-between-the-bounds", 5, 0, 10_000, 2400, 3 * 2400),
    ("floor-rounds-up-to-whole-tokens", 7, 0, 10_000, 1715, 3 * 1715),  # ceil(12000 / 7)
    ("fewer-streamed-layers-shorter-floor", 4, 2, 10_000, 1500, 3 * 1500),  # 6000 / 4
    ("floor-below-the-fixed-chunk-keeps-it", 100, 0, 10_000, PREFILL_CHUNK_TOKENS, 3 * PREFILL_CHUNK_TOKENS),
    ("floor-above-the-maximum-is-capped", 1, 0, 100_000, ELASTIC_PREFILL_MAX_TOKENS,
     3 * ELASTIC_PREFILL_MAX_TOKENS),
    ("short-prompt-bounds-the-peak", 5, 0, 300, 2400, 3 * 300),
    ("resident-model-unchanged", 5, None, 10_000, PREFILL_CHUNK_TOKENS, 3 * PREFILL_CHUNK_TOKENS),
    ("all-layers-resident-is-not-elastic", 5, 4, 10_000, PREFILL_CHUNK_TOKENS, 3 * PREFILL_CHUNK_TOKENS),
    ("link-speed-unknown-keeps-the-fixed-chunk", 0, 0, 10_000, PREFILL_CHUNK_TOKENS, 3 * PREFILL_CHUNK_TOKENS),
])
def test_prefill_chunk_is_sized_to_the_streaming_floor(case, per_token, resident, context, chunk, activation):
    terms = streaming(per_token)
    need = footprint(terms, context, 1, resident)
    assert (need.prefill_chunk_tokens, need.activation) == (chunk, activation), case
    assert prefill_chunk_tokens(terms, need.streamed_bytes) == chunk, case
    assert activation_bytes(terms, context, 1, need.streamed_bytes) == activation, case


@pytest.mark.parametrize("case,gbps,ms_per_1k,expected", [
    ("55-gbps-and-0.1-ms-per-token", 55.0, 100.0, 5_500_000),
    ("rounds-to-whole-bytes", 1.0, 0.0015, 2),
    ("no-link-figure", 0.0, 100.0, 0),
    ("no-prefill-figure", 55.0, 0.0, 0),
])
def test_link_bytes_per_prefill_token(case, gbps, ms_per_1k, expected):
    assert link_bytes_per_prefill_token(gbps, ms_per_1k) == expected, case


def test_swap_area_is_the_largest_member_and_zero_for_none():
    assert (swap_area([3, 9, 4]), swap_area([])) == (9, 0)


def test_default_overhead_is_256_mib_plus_one_percent_rounded_up():
    assert default_overhead_bytes(101) == (256 << 20) + 2


@settings(max_examples=300, deadline=None)
@given(layers=st.lists(st.integers(0, 1000), min_size=1, max_size=12), fixed=st.integers(0, 500),
       kv=st.integers(0, 5), context=st.integers(1, 2000), concurrency=st.integers(1, 8),
       limit=st.integers(0, 20_000), per_token=st.integers(0, 3))
def test_largest_elastic_is_the_most_layers_that_fit(layers, fixed, kv, context, concurrency, limit, per_token):
    terms = Terms(fixed, tuple(layers), kv, 1, 3, 11, per_token)  # per_token > 0: the chunk varies with k
    fitting = [footprint(terms, context, concurrency, k) for k in range(len(layers))
               if footprint(terms, context, concurrency, k).total <= limit]
    assert largest_elastic(terms, context, concurrency, limit) == (fitting[-1] if fitting else None)
    assert elastic_minimum(terms, context, concurrency) == footprint(terms, context, concurrency, 0)


@given(st.lists(st.integers(0, 3), min_size=1, max_size=20), st.integers(0, 10 ** 9))
def test_the_worker_config_form_round_trips_any_layer_sizes(layers, per_token):
    terms = Terms(5, tuple(layers), 1, 2, 3, 4, per_token)
    doc = terms_document(terms)
    assert terms_from_document(doc) == terms
    assert sum(run["count"] for run in doc["layerRuns"]) == len(layers)
