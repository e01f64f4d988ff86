"""The decoder layer's fused operations, each one operator (one kernel on a GPU) of the decode step.

Owns `add_rms_norm` (residual add, then the Llama-family RMSNorm), `rms_norm`, `rotary`
(rotate-half rotary embedding of the query and key heads together), `silu_mul` (the gated MLP's
activation over the merged gate/up projection) and `kv_write` (a step's keys and values into
their KV slots). Each is an operator of the `gpushare_engine` torch library: one entry in the
dispatcher, so a torch dispatch mode counts it once (bench/engine_ops.py) and a CUDA graph captures its
kernels. The implementation registered here is the reference composition of torch operations,
written to give the bits transformers' modules give (float32 statistics, the input dtype
after the normalisation, rotary in the input dtype): it runs on every device, and on CPU it is
the path the tests check token for token. On CUDA the same composition runs (a few kernels per
operator, captured in the decode graphs); single fused kernels for CUDA (Triton) are not written yet
and would register under the same operators. Called by engine/forward/decoder.py.
"""
from __future__ import annotations

import torch
from torch import Tensor

_library = torch.library.Library("gpushare_engine", "DEF")
_SCHEMAS = {
    "rms_norm": "rms_norm(Tensor x, Tensor weight, float eps) -> Tensor",
    "add_rms_norm": "add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)",
    "rotary": "rotary(Tensor x, Tensor cos, Tensor sin) -> Tensor",
    "silu_mul": "silu_mul(Tensor gate_up) -> Tensor",
    "kv_write": "kv_write(Tensor(a!) keys, Tensor(b!) values, Tensor slots, Tensor positions, Tensor k, Tensor v) -> ()",
}


def _rms(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    statistics = x.to(torch.float32)
    normed = statistics * torch.rsqrt(statistics.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype)


def _rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm over the last dimension (statistics in float32, the result in the input dtype)."""
    return _rms(x, weight, eps)


def _add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """(RMSNorm(x + residual), x + residual): a layer's residual add and the next norm in one operator."""
    added = x + residual
    return _rms(added, weight, eps), added


def _rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary embedding, rotate-half form, of x [N, heads, D] with cos/sin [N, 1, D] (the input's dtype)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def _silu_mul(gate_up: Tensor) -> Tensor:
    """silu(gate) * up over the merged projection [N, 2 * intermediate] (gate first)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def _kv_write(keys: Tensor, values: Tensor, slots: Tensor, positions: Tensor, k: Tensor, v: Tensor) -> None:
    """Store one key and value [N, kv_heads, D] per token at (slot, position) of keys/values
    [slots, kv_heads, context, D]."""
    keys[slots, :, positions] = k
    values[slots, :, positions] = v


for _name, _schema in _SCHEMAS.items():
    _library.define(_schema)
    _library.impl(_name, globals()[f"_{_name}"], "CompositeExplicitAutograd")

rms_norm = torch.ops.gpushare_engine.rms_norm
add_rms_norm = torch.ops.gpushare_engine.add_rms_norm
rotary = torch.ops.gpushare_engine.rotary
silu_mul = torch.ops.gpushare_engine.silu_mul
kv_write = torch.ops.gpushare_engine.kv_write
