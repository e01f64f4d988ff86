"""Exact weight bytes of a loaded model, by part: embeddings, each decoder layer, final norm, head.

Owns counting the bytes of every state-dict tensor (parameters and persistent
buffers) once, by identity, so tied embeddings are counted once, under the
embeddings (headBytes 0). Called by profiler_job.run (stage "weights").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from profiler_job.structure import Parts


@dataclass(frozen=True)
class WeightBytes:
    embedding: int
    layers: tuple[int, ...]
    final_norm: int
    head: int
    tied: bool

    @property
    def total(self) -> int:
        return self.embedding + sum(self.layers) + self.final_norm + self.head

    def derivation(self) -> dict[str, str]:
        return {"weights": "measured: bytes of every loaded parameter and persistent buffer (numel x element size), "
                           "each tensor counted once" + (" (LM head tied to the token embedding)" if self.tied else "")}


def measure_weights(model: Any, parts: Parts) -> WeightBytes:
    totals = {"embedding": 0, "finalNorm": 0, "head": 0}
    layers = [0] * parts.num_layers
    seen: set[int] = set()
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        part, index = parts.part_of(name)
        size = tensor.numel() * tensor.element_size()
        if index is None:
            totals[part] += size
        else:
            layers[index] += size
    return WeightBytes(totals["embedding"], tuple(layers), totals["finalNorm"], totals["head"], parts.tied)
