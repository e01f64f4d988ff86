"""The footprint arithmetic: the device bytes one model occupies, on plain numbers.

The one source of every memory term behind a decision. The planner
(controller.planning.cost) sizes models with it, the worker's admission
(worker.admission) admits with it, the profiler Job and the estimator
(contract.estimate) fill its inputs, so the plan's need is byte for byte the
worker's admission for the config the controller renders.

    need = weights on the device + streaming buffers (elastic) + KV cache
           + activation peak + runtime overhead

- weights: the fixed part (embeddings, final norm, LM head: always on the
  device) plus the resident decoder layers (all of them unless elastic);
- streaming buffers (elastic): two, each exactly the largest streamed layer (the
  worker packs a layer's tensors densely, largest element size first, so no
  padding is needed);
- KV cache: kvBytesPerToken × contextTokens × concurrency, reserved up front;
- activation peak: the larger of one prefill chunk (`prefill_chunk_tokens`
  tokens at most, so a long prompt never needs more) and one decode step of the
  whole batch. A resident model prefills in PREFILL_CHUNK_TOKENS; an elastic one
  in chunks sized to its streaming floor: every chunk streams each non-resident
  layer once, so a chunk is made long enough that its compute covers that stream
  (streamed bytes ÷ `stream_bytes_per_prefill_token`, the bytes the link copies
  while one prompt token prefills), between PREFILL_CHUNK_TOKENS and
  ELASTIC_PREFILL_MAX_TOKENS. The engine prefills in the same chunk;
- runtime overhead: measured by the profiler on a GPU, else the documented
  default `default_overhead_bytes` (256 MiB of library workspaces and sampler
  buffers + 1 % of the weights for allocator rounding, + the dequantization
  workspace of int8 weights). CUDA graph pools and library workspaces are
  charged against it.

Weights of every dtype (`linear_weight_bytes`): the decoder layers' linear
weights are stored in the compute dtype, or weight-only quantized (the names
and the device rules are contract.precision's):
- int8: 1 byte per weight + one scale per output channel (compute dtype); on a
  GPU the engine dequantizes one linear at a time into the compute dtype, so
  the largest linear in the compute dtype is added to the overhead
  (`dequantize_workspace_bytes`);
- int4: 1/2 byte per weight + a scale and a zero per group of
  `int4_group_size` inputs and output channel (compute dtype); a linear whose
  shape the int4 layout cannot pack stays in the compute dtype.
Embeddings, the LM head, norms and biases always stay in the compute dtype.

A swap group occupies the area of its largest member. Pure: no I/O, no torch.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property

from contract.quantity import format_bytes

PREFILL_CHUNK_TOKENS = 512          # prefill runs in chunks of at most this many tokens (bounds the peak)
ELASTIC_PREFILL_MAX_TOKENS = 4096   # an elastic model's streaming-floor chunk never exceeds this (bounds its peak)
OVERHEAD_BASE_BYTES = 256 << 20     # cuBLAS/cuBLASLt workspaces, sampler buffers, CUDA graph pools
OVERHEAD_WEIGHT_DIVISOR = 100       # + 1/100 of the weights: caching-allocator rounding and fragmentation
SAMPLER_LOGIT_BYTES = 4             # the sampler reads logits as float32
INT4_GROUP_SIZES = (128, 64, 32)    # torchao's int4 group (128), else the largest of these dividing in_features
INT4_OUT_MULTIPLE = 8               # the int4 layout packs output channels by 8


@dataclass(frozen=True)
class Terms:
    """What a footprint is computed from: one model at one dtype (a profile, or a checkpoint's shape)."""

    fixed_bytes: int                     # embeddings, final norm, LM head: never streamed
    layer_bytes: tuple[int, ...]         # each decoder layer, in order
    kv_bytes_per_token: int              # one sequence, all layers, K and V
    prefill_activation_bytes_per_token: int
    decode_activation_bytes_per_sequence: int
    overhead_bytes: int
    # host→device bytes the pinned link copies while one prompt token prefills (link GB/s × prefill time per
    # token, from the profile); 0 when unknown (a hand-written config): elastic prefill keeps the fixed chunk
    stream_bytes_per_prefill_token: int = 0

    @property
    def total_layers(self) -> int:
        return len(self.layer_bytes)

    @cached_property
    def layers_total(self) -> int:
        return sum(self.layer_bytes)

    @property
    def weight_bytes(self) -> int:
        return self.fixed_bytes + self.layers_total


@dataclass(frozen=True)
class Footprint:
    """Device bytes of one model, by part. `resident_layers` < `total_layers` only in elastic mode."""

    weights: int
    buffers: int
    kv_cache: int
    activation: int
    overhead: int
    resident_layers: int
    total_layers: int
    streamed_bytes: int
    prefill_chunk_tokens: int = PREFILL_CHUNK_TOKENS  # the engine's prefill chunk: prefill_chunk_tokens()

    @property
    def total(self) -> int:
        return self.weights + self.buffers + self.kv_cache + self.activation + self.overhead

    @property
    def elastic(self) -> bool:
        return self.resident_layers < self.total_layers


def kv_cache_bytes(terms: Terms, context_tokens: int, concurrency: int) -> int:
    return terms.kv_bytes_per_token * context_tokens * concurrency


def prefill_chunk_tokens(terms: Terms, streamed_bytes: int) -> int:
    """The most prompt tokens one prefill step runs. Resident (nothing streamed), or the link speed unknown:
    PREFILL_CHUNK_TOKENS. Elastic: the streaming floor, the fewest tokens whose compute covers one stream of
    the `streamed_bytes` (ceil(streamed ÷ stream_bytes_per_prefill_token)), at least PREFILL_CHUNK_TOKENS
    and at most ELASTIC_PREFILL_MAX_TOKENS. The planner, the admission and the engine all use this one."""
    per_token = terms.stream_bytes_per_prefill_token
    if streamed_bytes <= 0 or per_token <= 0:
        return PREFILL_CHUNK_TOKENS
    return max(PREFILL_CHUNK_TOKENS, min(ELASTIC_PREFILL_MAX_TOKENS, -(-streamed_bytes // per_token)))


def link_bytes_per_prefill_token(link_gbps: float, prefill_ms_per_1k_tokens: float) -> int:
    """Terms.stream_bytes_per_prefill_token from a profile's figures: GB/s × 1e9 × (ms per 1k tokens ÷ 1e6)
    seconds per token, rounded to whole bytes (0 when either figure is missing or not positive)."""
    if not (link_gbps > 0 and prefill_ms_per_1k_tokens > 0):
        return 0
    return round(link_gbps * prefill_ms_per_1k_tokens * 1e3)


def activation_bytes(terms: Terms, context_tokens: int, concurrency: int, streamed_bytes: int = 0) -> int:
    """The activation peak: one prefill step (prefill_chunk_tokens, at most the tokens of all `concurrency`
    sequences: the engine fills one step's chunk with several prompts when each is shorter), or one decode step
    of `concurrency` sequences."""
    chunk = min(context_tokens * concurrency, prefill_chunk_tokens(terms, streamed_bytes))
    prefill = terms.prefill_activation_bytes_per_token * chunk
    return max(prefill, terms.decode_activation_bytes_per_sequence * concurrency)


def stream_buffer_bytes(streamed_layer_bytes: Iterable[int]) -> int:
    """Both streaming buffers: each holds the largest streamed layer, packed densely."""
    return 2 * max(streamed_layer_bytes, default=0)


def footprint(terms: Terms, context_tokens: int, concurrency: int, resident_layers: int | None = None) -> Footprint:
    """The footprint with the first `resident_layers` decoder layers on the device (None: all of them)."""
    total = terms.total_layers
    kept = total if resident_layers is None else max(0, min(total, resident_layers))
    streamed = terms.layer_bytes[kept:] if kept < total else ()
    streamed_bytes = sum(streamed)
    return Footprint(
        weights=terms.fixed_bytes + terms.layers_total - streamed_bytes,
        buffers=stream_buffer_bytes(streamed),
        kv_cache=kv_cache_bytes(terms, context_tokens, concurrency),
        activation=activation_bytes(terms, context_tokens, concurrency, streamed_bytes),
        overhead=terms.overhead_bytes,
        resident_layers=kept, total_layers=total, streamed_bytes=streamed_bytes,
        prefill_chunk_tokens=prefill_chunk_tokens(terms, streamed_bytes))


def elastic_minimum(terms: Terms, context_tokens: int, concurrency: int) -> Footprint:
    """The smallest footprint that still serves: every decoder layer streamed."""
    return footprint(terms, context_tokens, concurrency, 0)


def largest_elastic(terms: Terms, context_tokens: int, concurrency: int, limit: int) -> Footprint | None:
    """The elastic footprint with the most resident layers (fewer than all) within `limit`, or None.
    One backward scan: with k layers resident, the buffers hold the largest of layers k..n-1 and the
    activation peak is that of the prefill chunk the streamed bytes size (prefill_chunk_tokens)."""
    layers = terms.layer_bytes
    fixed = kv_cache_bytes(terms, context_tokens, concurrency) + terms.overhead_bytes + terms.fixed_bytes
    resident, largest_after = terms.layers_total, 0
    for k in range(len(layers) - 1, -1, -1):
        size = layers[k]
        resident -= size
        largest_after = size if size > largest_after else largest_after
        streamed = terms.layers_total - resident
        activation = activation_bytes(terms, context_tokens, concurrency, streamed)
        if fixed + activation + resident + 2 * largest_after <= limit:  # 2 × largest: stream_buffer_bytes
            return Footprint(weights=terms.fixed_bytes + resident, buffers=2 * largest_after,
                             kv_cache=kv_cache_bytes(terms, context_tokens, concurrency), activation=activation,
                             overhead=terms.overhead_bytes, resident_layers=k, total_layers=len(layers),
                             streamed_bytes=streamed, prefill_chunk_tokens=prefill_chunk_tokens(terms, streamed))
    return None


def swap_area(needs: Sequence[int]) -> int:
    """A swap group occupies the area of its largest member (one member is on the device at a time)."""
    return max(needs, default=0)


def default_overhead_bytes(weight_bytes: int, workspace_bytes: int = 0) -> int:
    """The runtime overhead of a model no profiler measured: a fixed workspace plus 1 % of its weights, plus
    `workspace_bytes` (dequantize_workspace_bytes of int8 weights)."""
    return OVERHEAD_BASE_BYTES + math.ceil(weight_bytes / OVERHEAD_WEIGHT_DIVISOR) + workspace_bytes


def int4_group_size(out_features: int, in_features: int) -> int | None:
    """The int4 group of a linear [out_features, in_features]: the first of INT4_GROUP_SIZES dividing
    in_features, None when none does or out_features is not a multiple of INT4_OUT_MULTIPLE (it stays in the
    compute dtype)."""
    if out_features % INT4_OUT_MULTIPLE:
        return None
    return next((g for g in INT4_GROUP_SIZES if in_features % g == 0), None)


def linear_weight_bytes(out_features: int, in_features: int, weights: str, compute_bytes: int) -> int:
    """Device bytes of one linear weight [out_features, in_features] (its bias apart) stored as `weights`
    (a float dtype name, int8 or int4), scales and zeros in `compute_bytes` per element included."""
    if weights == "int8":
        return out_features * in_features + out_features * compute_bytes
    group = int4_group_size(out_features, in_features) if weights == "int4" else None
    if group is not None:
        return out_features * in_features // 2 + (in_features // group) * out_features * 2 * compute_bytes
    return out_features * in_features * compute_bytes


def dequantize_workspace_bytes(linears: Iterable[tuple[int, int]], weights: str, compute_bytes: int) -> int:
    """int8: the largest linear (out, in) in the compute dtype, which a GPU step dequantizes into; 0 otherwise."""
    if weights != "int8":
        return 0
    return max((out * inp * compute_bytes for out, inp in linears), default=0)


def kv_bytes_per_token(*, layers: int, kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """One sequence's KV cache per token: 2 (K and V) × layers × KV heads × head dim × dtype bytes."""
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def prefill_activation_per_token(*, hidden: int, heads: int, kv_heads: int, head_dim: int, intermediate: int,
                                 mlp_tensors: int, dtype_bytes: int) -> int:
    """Every tensor one decoder layer materialises per prompt token: residual + normed input (2·h), q, k, v
    and the attention output ((2·heads + 2·kvHeads)·headDim), and the MLP's `mlp_tensors`·i (3 for gated
    MLPs: gate, up, gate·up; 2 for GPT-2: fc, gelu). Attention scores are not materialised (SDPA)."""
    attention = (2 * heads + 2 * kv_heads) * head_dim
    return (2 * hidden + attention + mlp_tensors * intermediate) * dtype_bytes


def decode_activation_per_sequence(prefill_per_token: int, *, vocab: int, dtype_bytes: int) -> int:
    """One decode step of one sequence: one token's activations plus a logits row (dtype + float32 copy)."""
    return prefill_per_token + vocab * (dtype_bytes + SAMPLER_LOGIT_BYTES)


def terms_document(terms: Terms) -> dict:
    """The camelCase form a worker config carries (schemas/worker-config.schema.json `footprint`); the
    decoder layers as runs of equal sizes, since most models repeat one layer shape."""
    runs: list[dict] = []
    for size in terms.layer_bytes:
        if runs and runs[-1]["bytes"] == size:
            runs[-1]["count"] += 1
        else:
            runs.append({"bytes": size, "count": 1})
    return {"fixedBytes": terms.fixed_bytes, "layerRuns": runs,
            "kvBytesPerToken": terms.kv_bytes_per_token,
            "prefillActivationBytesPerToken": terms.prefill_activation_bytes_per_token,
            "decodeActivationBytesPerSequence": terms.decode_activation_bytes_per_sequence,
            "overheadBytes": terms.overhead_bytes,
            "streamBytesPerPrefillToken": terms.stream_bytes_per_prefill_token}


def terms_from_document(doc: dict) -> Terms:
    layers = tuple(run["bytes"] for run in doc["layerRuns"] for _ in range(run["count"]))
    return Terms(fixed_bytes=doc["fixedBytes"], layer_bytes=layers,
                 kv_bytes_per_token=doc["kvBytesPerToken"],
                 prefill_activation_bytes_per_token=doc["prefillActivationBytesPerToken"],
                 decode_activation_bytes_per_sequence=doc["decodeActivationBytesPerSequence"],
                 overhead_bytes=doc["overheadBytes"],
                 stream_bytes_per_prefill_token=doc.get("streamBytesPerPrefillToken", 0))


def describe(f: Footprint) -> str:
    """The parts of a footprint in words: `weights 1.0Gi + 2 streaming buffers 64.0Mi + KV cache ...`."""
    parts = [f"weights {format_bytes(f.weights)}"]
    if f.buffers:
        parts.append(f"2 streaming buffers {format_bytes(f.buffers)}")
    parts += [f"KV cache {format_bytes(f.kv_cache)}", f"activations {format_bytes(f.activation)}",
              f"overhead {format_bytes(f.overhead)}"]
    return " + ".join(parts)
