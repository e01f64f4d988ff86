"""The worker's own batched forward for the Llama, Qwen2 and Mistral families.

One call runs every sequence of a step through the model once: the new tokens of all
rows (one token for a decoding sequence, a chunk for a prefilling one) are flattened
into one [N, hidden] batch for every projection and MLP, so an elastic model streams
each layer once per step whatever the batch. Attention reads the static KV slots
(engine/forward/kv.py): decoding rows together, over the slots' used length, with
grouped-query heads folded into the query length (no K/V repetition); each prefill
chunk against its own slot with a causal mask. Weights are the checkpoint's own,
read from the transformers modules at call time (elastic points them at streaming
buffers between `enter_layer` and `leave_layer`). Rotary embeddings come from the
model's rotary module, so rope scaling variants stay the checkpoint's.

Called by engine/batch.py through `DecoderForward.run`, and by engine/forward/graphs.py,
which captures `decode_all` per batch-size bucket on CUDA.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..residency import Residency
from .kv import KVSlots
from .rows import Row

FAMILIES = ("llama", "qwen2", "mistral")


def unsupported_reason(model: nn.Module, context_tokens: int) -> str | None:
    """Why `model` cannot take this path (None when it can): family, module layout, sliding window."""
    config = model.config
    if config.model_type not in FAMILIES:
        return f"model_type {config.model_type!r} is not one of {list(FAMILIES)}"
    core = getattr(model, "model", None)
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    if core is None or not all(hasattr(core, n) for n in needed) or not hasattr(model, "lm_head"):
        return f"{type(model).__name__} lacks the expected model.{{{', '.join(needed)}}} and lm_head modules"
    for layer in core.layers:
        window = getattr(layer.self_attn, "sliding_window", None)
        if config.model_type == "mistral":
            window = getattr(config, "sliding_window", None)
        if window is not None and window < context_tokens:
            return f"a sliding attention window of {window} tokens is shorter than the context ({context_tokens})"
    return None


class DecoderForward:
    """Batched forward of one Llama-family model over static KV slots."""

    path = "decoder"

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
        self.slots, self.context = slots, context_tokens
        self.dtype = self.core.embed_tokens.weight.dtype
        self.kv: KVSlots | None = None

    @property
    def device(self) -> torch.device:
        return self.residency.device

    # KV lifetime: allocated while the weights are on the device (swap models drop it when evicted)
    def allocate(self) -> None:
        if self.kv is None:
            self.kv = KVSlots(self.residency.ledger, layers=len(self.layers), slots=self.slots,
                              kv_heads=self.kv_heads, context=self.context, head_dim=self.head_dim, dtype=self.dtype)

    def release(self) -> None:
        self.kv = None

    def free(self, slot: int) -> None:
        """Nothing to clear: a slot's stale positions are never read (attention stops at its length)."""

    def move(self, src: int, dst: int, length: int) -> None:
        self.kv.move(src, dst, length)

    @torch.inference_mode()
    def run(self, rows: list[Row]) -> torch.Tensor:
        """Float logits [len(rows), vocab] for the last new token of each row."""
        device = self.device
        tokens = torch.tensor([t for r in rows for t in r.tokens], dtype=torch.long, device=device)
        positions = torch.tensor([r.start + i for r in rows for i in range(len(r.tokens))], dtype=torch.long,
                                 device=device)
        token_slots = torch.tensor([r.slot for r in rows for _ in r.tokens], dtype=torch.long, device=device)
        ends = torch.tensor(_cumulative_ends(rows), dtype=torch.long, device=device)
        plan = _EagerAttention(rows, device, self.group)
        hidden = self.layers_pass(tokens, positions, token_slots, plan)
        return self.logits(hidden[ends])

    def decode_all(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Decode one token in each of slots 0..b-1 (b = len(tokens)), attending over the whole context.
        Shape-static: this is the step the CUDA graphs capture. Rows past the live batch write position
        context-1 of a free slot, which no live sequence reads."""
        slots = torch.arange(tokens.shape[0], device=tokens.device)
        hidden = self.layers_pass(tokens, positions, slots, _StaticDecodeAttention(positions, self.context, self.group))
        return self.logits(hidden)

    def layers_pass(self, tokens, positions, token_slots, attention) -> torch.Tensor:
        """Every decoder layer once over the flattened tokens; returns the final hidden states [N, hidden]."""
        residency, kv = self.residency, self.kv
        residency.start_pass()
        hidden = self.core.embed_tokens(tokens)[None]  # [1, N, hidden]: norms and MLPs see one long sequence
        cos, sin = self.core.rotary_emb(hidden, positions[None])
        cos, sin = cos[0, :, None, :], sin[0, :, None, :]
        n = tokens.shape[0]
        for index, layer in enumerate(self.layers):
            residency.enter_layer(index)
            attn = layer.self_attn
            x = layer.input_layernorm(hidden)
            q = _rotate(attn.q_proj(x).view(n, self.heads, self.head_dim), cos, sin)
            k = _rotate(attn.k_proj(x).view(n, self.kv_heads, self.head_dim), cos, sin)
            v = attn.v_proj(x).view(n, self.kv_heads, self.head_dim)
            kv.write(index, token_slots, positions, k, v)
            out = attention(q, kv.keys[index], kv.values[index])
            hidden = hidden + attn.o_proj(out[None])
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
            residency.leave_layer(index)
        return hidden[0]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head(self.core.norm(hidden)).float()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding (the rotate-half form of the Llama family)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def _cumulative_ends(rows: list[Row]) -> list[int]:
    ends, total = [], 0
    for row in rows:
        total += len(row.tokens)
        ends.append(total - 1)
    return ends


def _grouped_decode(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                    group: int) -> torch.Tensor:
    """One query token per slot: q [S, heads, D] against keys/values [S, kv_heads, L, D] under mask [S, L].
    The `group` query heads sharing a KV head become that head's query rows, so K/V are read as stored."""
    slots, heads, dim = q.shape
    q = q.view(slots, heads // group, group, dim)
    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask[:, None, None, :])
    return out.reshape(slots, heads * dim)


class _EagerAttention:
    """Attention for an eager step: decoding rows batched over the used length, prefill chunks one by one."""

    def __init__(self, rows: list[Row], device: torch.device, group: int):
        self.group = group
        self.decode: list[tuple[int, int]] = []  # (token index, slot)
        self.prefill: list[tuple[int, Row]] = []  # (first token index, row)
        lengths: dict[int, int] = {}  # decoding slot -> keys it attends to
        at = 0
        for row in rows:
            if len(row.tokens) == 1:
                self.decode.append((at, row.slot))
                lengths[row.slot] = row.start + 1
            else:
                self.prefill.append((at, row))
            at += len(row.tokens)
        self.total = at
        if self.decode:
            # every slot below the widest decoding one takes part (slots are compact); the others attend
            # to one key and their rows are dropped
            self.width = max(lengths) + 1
            per_slot = torch.tensor([lengths.get(s, 1) for s in range(self.width)], device=device)
            self.used = int(max(lengths.values()))
            self.decode_mask = torch.arange(self.used, device=device)[None, :] < per_slot[:, None]
            self.decode_index = torch.tensor([i for i, _ in self.decode], device=device)
            self.decode_slots = torch.tensor([s for _, s in self.decode], device=device)
        self.prefill_masks = [_causal(row.start, len(row.tokens), device).repeat(group, 1) for _, row in self.prefill]

    def __call__(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        heads, dim = q.shape[1], q.shape[2]
        out = q.new_empty(self.total, heads * dim)
        if self.decode:
            full = q.new_zeros(self.width, heads, dim)
            full[self.decode_slots] = q[self.decode_index]
            attended = _grouped_decode(full, keys[: self.width, :, : self.used], values[: self.width, :, : self.used],
                                       self.decode_mask, self.group)
            out[self.decode_index] = attended[self.decode_slots]
        for (at, row), mask in zip(self.prefill, self.prefill_masks):
            n, end = len(row.tokens), row.start + len(row.tokens)
            kv_heads = keys.shape[1]
            rows_q = q[at: at + n].transpose(0, 1).reshape(kv_heads, self.group * n, dim)[None]
            attended = F.scaled_dot_product_attention(rows_q, keys[row.slot: row.slot + 1, :, :end],
                                                      values[row.slot: row.slot + 1, :, :end], attn_mask=mask)
            out[at: at + n] = attended[0].reshape(heads, n, dim).transpose(0, 1).reshape(n, heads * dim)
        return out


class _StaticDecodeAttention:
    """Attention for `decode_all`: every slot 0..b-1 decodes one token over the whole context (graph-safe)."""

    def __init__(self, positions: torch.Tensor, context: int, group: int):
        self.mask = torch.arange(context, device=positions.device)[None, :] <= positions[:, None]
        self.group = group

    def __call__(self, q, keys, values):
        width = q.shape[0]
        return _grouped_decode(q, keys[:width], values[:width], self.mask, self.group)


def _causal(start: int, n: int, device: torch.device) -> torch.Tensor:
    """[n, start + n] bool: query i (at position start + i) sees keys 0..start + i."""
    return torch.arange(start + n, device=device)[None, :] <= (start + torch.arange(n, device=device))[:, None]
