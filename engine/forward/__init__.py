"""Forward passes the engine runs a step with, and the choice between them.

`make_forward` picks the engine's own batched decoder forward (decoder.py) for the
Llama, Qwen2, Qwen3 and Mistral families (sliding windows included) and transformers'
modules (hf.py) for the rest; on CUDA a resident or swap model's decoder forward replays
CUDA graphs, captured before the model serves, for decode-only steps (graphs.py). Every forward offers: `allocate`/`release` (KV memory while the
weights are on the device), `run(rows)` (logits per row), `free(slot)`, `move(src, dst,
length)` (slot compaction), and `fallback`: None, or why the model takes the non-batching
transformers forward (shown on the worker's /status). Called by engine/batch.py; the transformers KV-argument adapter is contract/hf_compat.py,
shared with the profiler.
"""
from __future__ import annotations

import logging

from ..residency import Residency
from .decoder import DecoderForward, unsupported_reason
from .hf import TransformersForward
from .rows import Row

log = logging.getLogger(__name__)

__all__ = ["Row", "make_forward", "forward_path"]


def forward_path(residency: Residency) -> tuple[str, str | None]:
    """("decoder", None) or ("transformers", why the decoder path does not apply)."""
    reason = unsupported_reason(residency.model)
    return ("transformers", reason) if reason else ("decoder", None)


def make_forward(residency: Residency, *, slots: int, context_tokens: int, kv_bytes: int, graphs: bool = True):
    path, reason = forward_path(residency)
    if path == "transformers":
        log.info("%s: transformers forward (%s)", residency.ledger.model, reason)
        return TransformersForward(residency, kv_bytes=kv_bytes, fallback=reason)
    forward = DecoderForward(residency, slots=slots, context_tokens=context_tokens)
    if graphs and residency.device.type == "cuda" and residency.mode in ("resident", "swap"):
        from .graphs import GraphedDecoder

        return GraphedDecoder(forward)
    return forward
