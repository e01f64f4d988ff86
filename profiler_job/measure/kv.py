"""KV-cache bytes per token: the formula from the config, confirmed by a real forward pass's cache.

Owns reading the formula's numbers (contract.footprint.kv_bytes_per_token: 2 (K and V)
x layers x KV heads x head dim x dtype bytes) from a config, and the check that the cache a forward pass really allocates holds exactly that
(else KVCacheMismatch). Called by profiler_job.run (stage "kv").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from contract.footprint import kv_bytes_per_token
from profiler_job.errors import KVCacheMismatch
from profiler_job.measure.device import Device, dtype_bytes, forward

PROBE_TOKENS = 8


@dataclass(frozen=True)
class KvShape:
    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int

    @property
    def bytes_per_token(self) -> int:
        return kv_bytes_per_token(layers=self.layers, kv_heads=self.kv_heads, head_dim=self.head_dim,
                                  dtype_bytes=self.dtype_bytes)

    def formula(self) -> str:
        return (f"2 x {self.layers} layers x {self.kv_heads} KV heads x {self.head_dim} head dim "
                f"x {self.dtype_bytes} bytes = {self.bytes_per_token}")


@dataclass(frozen=True)
class KvResult:
    bytes_per_token: int
    derivation: dict[str, str]


def kv_shape(config: Any, element_bytes: int) -> KvShape:
    heads = config.num_attention_heads
    return KvShape(
        layers=config.num_hidden_layers,
        kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
        dtype_bytes=element_bytes,
    )


def cache_bytes(cache: Any) -> int:
    """Bytes held by a transformers Cache: the K and V tensors of every layer."""
    return sum(layer.keys.numel() * layer.keys.element_size() + layer.values.numel() * layer.values.element_size()
               for layer in cache.layers)


def measure_kv(model: Any, device: Device) -> KvResult:
    shape = kv_shape(model.config, dtype_bytes(model))
    ids = device.tokens(model.config.vocab_size, 1, PROBE_TOKENS)
    observed = cache_bytes(forward(model, ids).cache) / PROBE_TOKENS
    if observed != shape.bytes_per_token:
        raise KVCacheMismatch(
            f"{type(model).__name__}: the config gives {shape.formula()} KV bytes per token but a forward pass "
            f"cached {observed:g}; this cache layout (sliding window, latent or quantised KV) is not modelled, "
            "profile a model with standard attention")
    return KvResult(shape.bytes_per_token, {
        "kvCache.bytesPerToken": f"measured: {shape.formula()} from the config, equal to the K/V tensors a "
                                 f"{PROBE_TOKENS}-token forward pass cached on {device.type}"})
