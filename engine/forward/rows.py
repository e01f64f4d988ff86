"""A step's unit of work for one sequence: the new tokens to run and where they go in the KV cache.

Built by engine/batch.py for each seated sequence every step; consumed by the forwards
(engine/forward/decoder.py and hf.py).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    slot: int  # the sequence's KV slot
    start: int  # tokens already in the slot: the position of the first new token
    tokens: tuple[int, ...]  # one token while decoding, up to a prefill chunk while prefilling
