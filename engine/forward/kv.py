"""Static KV-cache slots: one slot per admitted concurrent sequence, each `context_tokens` long.

The whole cache is allocated through the model's DeviceLedger, so its bytes are exactly
the admitted KV reservation (2 x layers x KV heads x head dim x dtype bytes x
contextTokens x concurrency) and never an allocation outside the ledger. Layout per
layer: keys and values of shape [slots, kv_heads, context, head_dim], zeroed, so any
slot row attention may read is finite. The decoder writes them with the fused kv_write
operator (engine/forward/fused.py). Called by engine/forward/decoder.py.
"""
from __future__ import annotations

import torch

from ..memory import DeviceLedger


class KVSlots:
    def __init__(self, ledger: DeviceLedger, *, layers: int, slots: int, kv_heads: int, context: int,
                 head_dim: int, dtype: torch.dtype):
        self.slots, self.context = slots, context
        element = torch.empty((), dtype=dtype).element_size()
        per_tensor = slots * kv_heads * context * head_dim
        flat = ledger.empty(2 * layers * per_tensor * element, dtype=dtype)
        flat.zero_()
        if flat.is_cuda:  # the model's own stream uses the slots next: the zeros must have landed
            torch.cuda.current_stream(flat.device).synchronize()
        shaped = flat.view(2, layers, slots, kv_heads, context, head_dim)
        self.keys = list(shaped[0].unbind(0))
        self.values = list(shaped[1].unbind(0))
        self.nbytes = flat.numel() * element

    def move(self, src: int, dst: int, length: int) -> None:
        """Copy the first `length` positions of slot `src` into slot `dst` (compaction after a leave)."""
        for keys, values in zip(self.keys, self.values):
            keys[dst, :, :length].copy_(keys[src, :, :length])
            values[dst, :, :length].copy_(values[src, :, :length])
