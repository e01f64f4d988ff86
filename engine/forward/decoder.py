"""The engine's own batched forward for the Llama, Qwen2, Qwen3 and Mistral families.

One call runs every sequence of a step through the model once: the new tokens of all
rows (one token for a decoding sequence, a chunk for a prefilling one) are flattened
into one [N, hidden] batch for every projection and MLP, so an elastic model streams
each layer once per step whatever the batch.

A decoder layer is nine operators (fused.py): residual add with RMSNorm, the merged q/k/v
projection, rotary on the query and key heads together, the KV write, attention, the output
projection, residual add with RMSNorm, the merged gate/up projection, silu-times-up and the down
projection (Qwen3 adds its q and k norms). q, k and v (and gate and up) are one projection because
the residency packs each layer's parameters side by side (engine/residency `pack_order`): the
merged weight is a view of the packed bytes, no copy; unpacked weights are concatenated per call.
Weights are the checkpoint's own, read from the transformers modules at call time (elastic points
them at streaming buffers between `enter_layer` and `leave_layer`), or int8/int4 (engine/quantize.py: one
weight-only kernel per projection); rotary embeddings come from
the model's rotary module, so rope scaling variants stay the checkpoint's.

Attention reads the static KV slots (kv.py) over the used length, never the configured context:
a decode-only step (every seated sequence decodes one token, the steady state) attends over the
smallest KV-length bucket (`kv_buckets`: powers of two up to the context) that holds the longest
sequence, with an additive mask for the shorter rows and for sliding-window layers; grouped-query
heads are folded into the query length, so K/V are read as stored. `decode_step` is that step,
shape-static per (batch, KV-length bucket): graphs.py captures it on CUDA. A step with a prefill
chunk runs `run`'s eager path: decoding rows batched, and the prefill chunks batched in one
attention call too (padded to the longest chunk), each against its own slot with a causal (and
windowed) mask. Called by engine/batch.py through `run`, and by graphs.py.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..quantize import QuantizedLinear
from ..residency import Residency
from ..transfer import upload
from .fused import add_rms_norm, kv_write, rms_norm, rotary, silu_mul
from .kv import KVSlots
from .rows import Row

FAMILIES = ("llama", "qwen2", "qwen3", "mistral")
SMALLEST_KV_BUCKET = 32


def unsupported_reason(model: nn.Module) -> str | None:
    """Why `model` cannot take this path (None when it can): family, module layout."""
    config = model.config
    if config.model_type not in FAMILIES:
        return f"model_type {config.model_type!r} is not one of {list(FAMILIES)}"
    core = getattr(model, "model", None)
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    if core is None or not all(hasattr(core, n) for n in needed) or not hasattr(model, "lm_head"):
        return f"{type(model).__name__} lacks the expected model.{{{', '.join(needed)}}} and lm_head modules"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"the MLP activation {config.hidden_act!r} is not silu"
    return None


def kv_buckets(context: int) -> list[int]:
    """The KV lengths a decode step attends over: powers of two from SMALLEST_KV_BUCKET, and the context."""
    sizes, size = [], SMALLEST_KV_BUCKET
    while size < context:
        sizes.append(size)
        size *= 2
    return sizes + [context]


def kv_bucket(context: int, longest: int) -> int:
    """The smallest KV-length bucket holding `longest` keys."""
    return next(b for b in kv_buckets(context) if b >= longest)


def joined(tensors: list[torch.Tensor]) -> torch.Tensor:
    """`tensors` stacked along dim 0: a view when they lie side by side in one storage, else a copy."""
    first = tensors[0]
    at, storage = first.data_ptr(), first.untyped_storage().data_ptr()
    for t in tensors:
        if t.dtype != first.dtype or t.shape[1:] != first.shape[1:] or not t.is_contiguous() or t.data_ptr() != at \
                or t.untyped_storage().data_ptr() != storage:
            return torch.cat(tensors)
        at += t.numel() * t.element_size()
    return first.as_strided((sum(t.shape[0] for t in tensors), *first.shape[1:]), first.stride())


def _window(model: nn.Module, layer: nn.Module) -> int | None:
    """The layer's sliding attention window (keys after position - window), None for full attention."""
    if model.config.model_type == "mistral":
        return getattr(model.config, "sliding_window", None)
    return getattr(layer.self_attn, "sliding_window", None)


class DecoderForward:
    """Batched forward of one Llama-family model over static KV slots."""

    path = "decoder"
    fallback = None

    def __init__(self, residency: Residency, *, slots: int, context_tokens: int):
        model = residency.model
        config = model.config
        self.residency = residency
        self.core, self.head = model.model, model.lm_head
        self.layers = list(self.core.layers)
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.group = self.heads // self.kv_heads
        self.eps = config.rms_norm_eps
        self.windows = [w if w is not None and w < context_tokens else None for w in
                        (_window(model, layer) for layer in self.layers)]
        self.qk_norm = config.model_type == "qwen3"
        self.slots, self.context = slots, context_tokens
        self.dtype = self.core.embed_tokens.weight.dtype
        self.kv: KVSlots | None = None
        self.merged = _Merged()

    @property
    def device(self) -> torch.device:
        return self.residency.device

    # KV lifetime: allocated while the weights are on the device (swap models drop it when evicted)
    def allocate(self) -> None:
        if self.kv is None:
            self.kv = KVSlots(self.residency.ledger, layers=len(self.layers), slots=self.slots,
                              kv_heads=self.kv_heads, context=self.context, head_dim=self.head_dim, dtype=self.dtype)

    def release(self) -> None:
        """Swap-out: drop the KV slots and the merged views (they would keep the device weights alive)."""
        self.kv = None
        self.merged = _Merged()

    def free(self, slot: int) -> None:
        """Nothing to clear: a slot's stale positions are never read (attention stops at its length)."""

    def move(self, src: int, dst: int, length: int) -> None:
        self.kv.move(src, dst, length)

    @torch.inference_mode()
    def run(self, rows: list[Row]) -> torch.Tensor:
        """Float logits [len(rows), vocab] for the last new token of each row."""
        device = self.device
        if all(len(r.tokens) == 1 for r in rows) and [r.slot for r in rows] == list(range(len(rows))):
            tokens = upload([r.tokens[0] for r in rows], torch.long, device)
            positions = upload([r.start for r in rows], torch.long, device)
            return self.decode_step(tokens, positions, kv_bucket(self.context, max(r.start for r in rows) + 1))
        tokens = upload([t for r in rows for t in r.tokens], torch.long, device)
        positions = upload([r.start + i for r in rows for i in range(len(r.tokens))], torch.long, device)
        token_slots = upload([r.slot for r in rows for _ in r.tokens], torch.long, device)
        ends = upload(_cumulative_ends(rows), torch.long, device)
        plan = _EagerAttention(rows, device, self.group, self.windows, self.dtype)
        hidden = self.layers_pass(tokens, positions, token_slots, plan)
        return self.logits(hidden[ends])

    def decode_step(self, tokens: torch.Tensor, positions: torch.Tensor, length: int) -> torch.Tensor:
        """Decode one token in each of slots 0..b-1 (b = len(tokens)) attending over the first `length`
        positions of each slot (every live position < length). Shape-static per (b, length): the step the
        CUDA graphs capture. A graph's padding rows write the context's last position (graphs.py)."""
        slots = torch.arange(tokens.shape[0], device=tokens.device)
        attention = _DecodeAttention(positions, length, self.group, self.windows, self.dtype)
        return self.logits(self.layers_pass(tokens, positions, slots, attention))

    def layers_pass(self, tokens, positions, token_slots, attention) -> torch.Tensor:
        """Every decoder layer once over the flattened tokens; returns the final hidden states [N, hidden]."""
        residency, kv = self.residency, self.kv
        residency.start_pass()
        hidden = self.core.embed_tokens(tokens)
        cos, sin = self.core.rotary_emb(hidden[None], positions[None])
        cos, sin = cos[0, :, None, :], sin[0, :, None, :]
        n, heads, kv_heads, dim = tokens.shape[0], self.heads, self.kv_heads, self.head_dim
        q_end, k_end = heads * dim, (heads + kv_heads) * dim
        residual, linear = None, self.merged.linear
        for index, layer in enumerate(self.layers):
            residency.enter_layer(index)
            attn, mlp = layer.self_attn, layer.mlp
            if residual is None:
                residual, x = hidden, rms_norm(hidden, layer.input_layernorm.weight, self.eps)
            else:
                x, residual = add_rms_norm(hidden, residual, layer.input_layernorm.weight, self.eps)
            qkv = linear(x, [attn.q_proj, attn.k_proj, attn.v_proj])
            if self.qk_norm:
                q = rms_norm(qkv[:, :q_end].view(n, heads, dim), attn.q_norm.weight, self.eps)
                k = rms_norm(qkv[:, q_end:k_end].view(n, kv_heads, dim), attn.k_norm.weight, self.eps)
                q, k = rotary(q, cos, sin), rotary(k, cos, sin)
            else:
                qk = rotary(qkv[:, :k_end].view(n, heads + kv_heads, dim), cos, sin)
                q, k = qk[:, :heads], qk[:, heads:]
            kv_write(kv.keys[index], kv.values[index], token_slots, positions, k,
                     qkv[:, k_end:].view(n, kv_heads, dim))
            out = attention(q, kv.keys[index], kv.values[index], index)
            hidden = linear(out, [attn.o_proj])
            x, residual = add_rms_norm(hidden, residual, layer.post_attention_layernorm.weight, self.eps)
            hidden = linear(silu_mul(linear(x, [mlp.gate_proj, mlp.up_proj])), [mlp.down_proj])
            residency.leave_layer(index)
        return hidden if residual is None else hidden + residual

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head(rms_norm(hidden, self.core.norm.weight, self.eps)).float()


class _Merged:
    """The merged projections of the layers, as views of the packed weights, kept while the weights stay
    where they are (checked by the first tensor's address, which moves when a layer's bytes move)."""

    def __init__(self):
        self.views: dict[tuple[int, ...], tuple[int, torch.Tensor]] = {}

    def __call__(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        key = tuple(id(t) for t in tensors)
        at = tensors[0].data_ptr()
        cached = self.views.get(key)
        if cached is not None and cached[0] == at:
            return cached[1]
        merged = joined(tensors)
        if merged.untyped_storage().data_ptr() == tensors[0].untyped_storage().data_ptr():  # a view: keep it
            self.views[key] = (at, merged)
        return merged

    def linear(self, x: torch.Tensor, modules: list[nn.Linear]) -> torch.Tensor:
        """x through `modules` as one merged projection (their outputs side by side). Weight-only quantized
        linears (engine/quantize.py) run one kernel each, their outputs joined."""
        if isinstance(modules[0], QuantizedLinear):
            outs = [m(x) for m in modules]
            return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)
        weight = self([m.weight for m in modules])
        if modules[0].bias is None:
            return x @ weight.t()
        return torch.addmm(self([m.bias for m in modules]), x, weight.t())


def _cumulative_ends(rows: list[Row]) -> list[int]:
    ends, total = [], 0
    for row in rows:
        total += len(row.tokens)
        ends.append(total - 1)
    return ends


def _additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where attended, -inf elsewhere: the mask SDPA adds to the scores as is."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, float("-inf"))


def _decode_masks(lengths: torch.Tensor, width: int, windows: list[int | None], dtype: torch.dtype) -> dict:
    """Per window (None: full attention), the additive [S, 1, 1, width] mask of slots whose query sits at
    position lengths - 1."""
    keys = torch.arange(width, device=lengths.device)[None, :]
    masks = {}
    for window in set(windows):
        allowed = keys < lengths[:, None]
        if window is not None:
            allowed &= keys >= lengths[:, None] - window
        masks[window] = _additive(allowed, dtype)[:, None, None, :]
    return masks


def _grouped_decode(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                    group: int) -> torch.Tensor:
    """One query token per slot: q [S, heads, D] against keys/values [S, kv_heads, L, D] under mask.
    The `group` query heads sharing a KV head become that head's query rows, so K/V are read as stored."""
    slots, heads, dim = q.shape
    q = q.reshape(slots, heads // group, group, dim)
    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
    return out.reshape(slots, heads * dim)


class _DecodeAttention:
    """Attention for `decode_step`: slot i decodes one token at positions[i] over the first `length` keys."""

    def __init__(self, positions: torch.Tensor, length: int, group: int, windows: list[int | None],
                 dtype: torch.dtype):
        self.length, self.group, self.windows = length, group, windows
        self.masks = _decode_masks(positions + 1, length, windows, dtype)

    def __call__(self, q, keys, values, layer: int):
        width, length = q.shape[0], self.length
        return _grouped_decode(q, keys[:width, :, :length], values[:width, :, :length],
                               self.masks[self.windows[layer]], self.group)


class _EagerAttention:
    """Attention for a step with a prefill chunk: decoding rows batched over the used length, and the
    prefill chunks batched too, each against its own slot, padded to the longest chunk."""

    def __init__(self, rows: list[Row], device: torch.device, group: int, windows: list[int | None],
                 dtype: torch.dtype):
        self.group, self.windows = group, windows
        decode: list[tuple[int, int]] = []  # (token index, slot)
        prefill: list[tuple[int, Row]] = []  # (first token index, row)
        lengths: dict[int, int] = {}  # decoding slot -> keys it attends to
        at = 0
        for row in rows:
            if len(row.tokens) == 1:
                decode.append((at, row.slot))
                lengths[row.slot] = row.start + 1
            else:
                prefill.append((at, row))
            at += len(row.tokens)
        self.total, self.decoding, self.prefilling = at, bool(decode), bool(prefill)
        if decode:
            # every slot below the widest decoding one takes part (slots are compact); the others attend
            # to one key and their rows are dropped
            self.width = max(lengths) + 1
            per_slot = upload([lengths.get(s, 1) for s in range(self.width)], torch.long, device)
            self.used = int(max(lengths.values()))
            self.decode_masks = _decode_masks(per_slot, self.used, windows, dtype)
            self.decode_index = upload([i for i, _ in decode], torch.long, device)
            self.decode_slots = upload([s for _, s in decode], torch.long, device)
        if prefill:
            self.chunk = max(len(row.tokens) for _, row in prefill)  # queries per row, padded
            self.end = max(row.start + len(row.tokens) for _, row in prefill)  # keys per row
            # padding queries repeat the row's last token: they are computed and dropped
            self.prefill_index = upload([[at + min(i, len(row.tokens) - 1) for i in range(self.chunk)]
                                         for at, row in prefill], torch.long, device)
            self.prefill_kept = upload([r * self.chunk + i for r, (_, row) in enumerate(prefill)
                                        for i in range(len(row.tokens))], torch.long, device)
            self.prefill_out = upload([at + i for at, row in prefill for i in range(len(row.tokens))], torch.long,
                                      device)
            self.prefill_slots = upload([row.slot for _, row in prefill], torch.long, device)
            self.prefill_masks = {w: torch.stack([_additive(_causal(row.start, len(row.tokens), w, device, self.chunk,
                                                                    self.end), dtype) for _, row in prefill])
                                  .repeat(1, group, 1)[:, None] for w in set(windows)}

    def __call__(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, layer: int) -> torch.Tensor:
        heads, dim = q.shape[1], q.shape[2]
        window = self.windows[layer]
        out = q.new_empty(self.total, heads * dim)
        if self.decoding:
            full = q.new_zeros(self.width, heads, dim)
            full[self.decode_slots] = q[self.decode_index]
            attended = _grouped_decode(full, keys[: self.width, :, : self.used], values[: self.width, :, : self.used],
                                       self.decode_masks[window], self.group)
            out[self.decode_index] = attended[self.decode_slots]
        if self.prefilling:
            rows, chunk, kv_heads = self.prefill_index.shape[0], self.chunk, keys.shape[1]
            rows_q = q[self.prefill_index].view(rows, chunk, kv_heads, self.group, dim).permute(0, 2, 3, 1, 4)
            attended = F.scaled_dot_product_attention(
                rows_q.reshape(rows, kv_heads, self.group * chunk, dim), keys[self.prefill_slots, :, : self.end],
                values[self.prefill_slots, :, : self.end], attn_mask=self.prefill_masks[window])
            attended = attended.view(rows, kv_heads, self.group, chunk, dim).permute(0, 3, 1, 2, 4)
            out[self.prefill_out] = attended.reshape(rows * chunk, heads * dim)[self.prefill_kept]
        return out


def _causal(start: int, n: int, window: int | None, device: torch.device, queries: int, keys: int) -> torch.Tensor:
    """[queries, keys] bool: query i (at position start + i) sees keys 0..start + i (the last `window` of
    them), in a [queries, keys] frame; padding queries (i >= n) see what the last one sees."""
    key = torch.arange(keys, device=device)[None, :]
    query = (start + torch.arange(queries, device=device).clamp(max=n - 1))[:, None]
    allowed = key <= query
    if window is not None:
        allowed &= key > query - window
    return allowed
