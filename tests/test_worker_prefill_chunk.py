"""The worker prefills each model in the chunk its footprint was admitted with (contract.footprint
prefill_chunk_tokens): an elastic model with planned terms in its streaming-floor chunk, a resident one in
the fixed chunk, and the activation it reserves is that chunk's."""
from __future__ import annotations

from dataclasses import replace

import pytest

from contract.footprint import PREFILL_CHUNK_TOKENS, terms_document
from worker.admission import need_for
from worker.shape import estimated_terms, read_shape
from worker_support import (  # noqa: F401  (fixtures are used by name)
    config_document, model_entry, single_threaded_torch, started_worker, tiny_models,
)


@pytest.mark.parametrize("case,mode,extra,floor_chunk", [
    ("elastic-with-planned-link-speed-uses-the-floor", "elastic", {"residentLayers": 1}, True),
    ("elastic-without-terms-keeps-the-fixed-chunk", "elastic", {"residentLayers": 1}, False),
    ("resident-model-unchanged", "resident", {}, False),
])
def test_the_engine_prefills_in_the_admitted_chunk(tiny_models, case, mode, extra, floor_chunk):
    path = tiny_models["llama"]
    terms = estimated_terms(read_shape(path))
    if floor_chunk or mode == "resident":
        extra = {**extra, "footprint": terms_document(
            replace(terms, stream_bytes_per_prefill_token=sum(terms.layer_bytes[1:]) // 600))}
    worker = started_worker(config_document([model_entry("m", path, mode, context=2048, concurrency=1, **extra)]))
    try:
        served = worker.served["m"]
        need = need_for(served.config, worker.shapes["m"], extra.get("residentLayers"))
        assert served.engine.prefill_chunk == need.prefill_chunk_tokens, case
        assert (served.engine.prefill_chunk > PREFILL_CHUNK_TOKENS) == floor_chunk, case
        assert worker.ledgers["m"].reserved("activation") == need.activation, case
    finally:
        worker.stop()
