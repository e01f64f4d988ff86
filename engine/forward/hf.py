"""The fallback forward: transformers' own modules, one forward per sequence, a DynamicCache per slot.

Serves every architecture the decoder path (engine/forward/decoder.py) does not take,
GPT-2 among them. A step still batches at the scheduling level (sequences join and
leave at step boundaries, prefill is chunked), but each sequence runs its own forward,
so an elastic model on this path streams its layers once per sequence per step. Its KV
cache grows inside transformers, so the admitted KV bytes are held as a reservation on
the model's ledger instead of a ledger allocation. Called by engine/batch.py.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache

from contract.hf_compat import cache_kwargs

from ..residency import Residency
from .rows import Row


class TransformersForward:
    path = "transformers"

    def __init__(self, residency: Residency, *, kv_bytes: int, fallback: str):
        self.residency = residency
        self.fallback = fallback  # why the batching decoder forward does not apply
        self.model = residency.model
        self.kv_bytes = kv_bytes
        self.caches: dict[int, DynamicCache] = {}

    def allocate(self) -> None:
        self.residency.ledger.reserve("kv-cache", self.kv_bytes)

    def release(self) -> None:
        self.caches.clear()

    def free(self, slot: int) -> None:
        self.caches.pop(slot, None)

    def move(self, src: int, dst: int, length: int) -> None:
        cache = self.caches.pop(src, None)  # None: the moved sequence has not run a step yet
        if cache is not None:
            self.caches[dst] = cache

    @torch.inference_mode()
    def run(self, rows: list[Row]) -> torch.Tensor:
        out = []
        for row in rows:
            cache = self.caches.get(row.slot)
            if cache is None or row.start == 0:
                cache = self.caches[row.slot] = DynamicCache(config=self.model.config)
            ids = torch.tensor([row.tokens], dtype=torch.long, device=self.residency.device)
            output = self.model(input_ids=ids, use_cache=True, logits_to_keep=1, **cache_kwargs(self.model, cache))
            out.append(output.logits[0, -1].float())
        return torch.stack(out)
