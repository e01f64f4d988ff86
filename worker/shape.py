"""A model's real shape, read before loading: weight bytes per part and per decoder layer,
KV-cache bytes per token and the architecture numbers activations follow, from config.json
and safetensors headers only.

Called by the worker runtime before admission (no weights are read). `estimated_terms`
turns a shape into footprint terms by the shared rules (contract.footprint) when the
config carries none; admission checks a checkpoint against the terms it was planned with.
"""
from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from contract.footprint import (Terms, decode_activation_per_sequence, default_overhead_bytes,
                                dequantize_workspace_bytes, kv_bytes_per_token, linear_weight_bytes,
                                prefill_activation_per_token)
from contract.precision import (AUTO, UnsupportedPrecision, checkpoint_quantization, choose,
                                quantized_checkpoint_fix)

from .errors import ModelLoadError

_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
_FLOAT_DTYPES = {"F64", "F32", "F16", "BF16"}
_TORCH_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
_LAYER = re.compile(r"(?:^|\.)(?:layers|h|blocks)\.(\d+)\.")
_EMBEDDING = re.compile(r"embed|(?:^|\.)(?:wte|wpe)\.")


@dataclass(frozen=True)
class ModelShape:
    """Bytes of one model at its compute dtype, its decoder linears stored as `weights`."""

    dtype: str
    embedding_bytes: int
    layer_bytes: tuple[int, ...]
    other_bytes: int  # final norm, LM head and anything outside the decoder layers
    kv_bytes_per_token: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    mlp_tensors: int  # activations the MLP materialises per token, in units of intermediate_size
    vocab_size: int
    weights: str = ""  # the decoder linears: int8, int4, or "" (the compute dtype)
    linears: tuple[tuple[int, int], ...] = ()  # (out, in) of every distinct decoder linear

    @property
    def stored_dtype(self) -> str:
        return self.weights or self.dtype

    @property
    def weight_bytes(self) -> int:
        return self.embedding_bytes + sum(self.layer_bytes) + self.other_bytes

    @property
    def total_layers(self) -> int:
        return len(self.layer_bytes)

    @property
    def element_bytes(self) -> int:
        return _TORCH_DTYPE_BYTES[self.dtype]


def estimated_terms(shape: ModelShape) -> Terms:
    """Footprint terms of a checkpoint no profile describes: exact weights and KV cache, activations and
    overhead by the documented defaults (the estimator's rules, contract.footprint)."""
    per_token = prefill_activation_per_token(
        hidden=shape.hidden_size, heads=shape.num_attention_heads, kv_heads=shape.num_key_value_heads,
        head_dim=shape.head_dim, intermediate=shape.intermediate_size, mlp_tensors=shape.mlp_tensors,
        dtype_bytes=shape.element_bytes)
    return Terms(fixed_bytes=shape.embedding_bytes + shape.other_bytes, layer_bytes=shape.layer_bytes,
                 kv_bytes_per_token=shape.kv_bytes_per_token, prefill_activation_bytes_per_token=per_token,
                 decode_activation_bytes_per_sequence=decode_activation_per_sequence(
                     per_token, vocab=shape.vocab_size, dtype_bytes=shape.element_bytes),
                 overhead_bytes=default_overhead_bytes(shape.weight_bytes, dequantize_workspace_bytes(
                     shape.linears, shape.stored_dtype, shape.element_bytes)))


MAX_HEADER_BYTES = 100 * 1000 * 1000  # the safetensors format's own bound on its JSON header


def read_safetensors_header(path: Path) -> dict[str, dict]:
    """The tensor table of one .safetensors file: name -> {dtype, shape, data_offsets}. A header that is
    short, oversized, not JSON, or whose tensors end past the file's last byte (a truncated download) is
    ModelUnreadable: the worker refuses the checkpoint before admitting it."""
    def unreadable(why: str) -> ModelLoadError:
        return ModelLoadError("ModelUnreadable", f"{path} is not a complete safetensors file: {why}; re-save or "
                              "re-download the model")

    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            prefix = f.read(8)
            if len(prefix) < 8:
                raise unreadable(f"{size} bytes, shorter than its 8-byte header length")
            (length,) = struct.unpack("<Q", prefix)
            if length > min(MAX_HEADER_BYTES, size - 8):
                raise unreadable(f"its header claims {length} bytes of a {size}-byte file")
            header = json.loads(f.read(length))
    except OSError as exc:
        raise unreadable(str(exc)) from exc
    except ValueError as exc:  # not UTF-8, not JSON
        raise unreadable(f"its header is not JSON ({exc})") from exc
    if not isinstance(header, dict):
        raise unreadable("its header is not a JSON object")
    header.pop("__metadata__", None)
    end = 0
    for name, info in header.items():
        try:
            start, stop = info["data_offsets"]
            end = max(end, int(stop))
            if not 0 <= int(start) <= int(stop) or info["dtype"] not in _DTYPE_BYTES or not all(
                    isinstance(d, int) and d >= 0 for d in info["shape"]):
                raise ValueError
        except (KeyError, TypeError, ValueError) as exc:
            raise unreadable(f"tensor {name!r} has no valid dtype, shape and data_offsets") from exc
    if 8 + length + end > size:
        raise unreadable(f"its tensors end at byte {8 + length + end} but the file has {size} (truncated)")
    return header


def read_shape(model_dir: Path, dtype: str = "auto", weights: str = AUTO,
               capability: tuple[int, int] | None = None) -> ModelShape:
    """The shape of the model saved in `model_dir` at `dtype` ("auto": what contract.precision chooses on a
    device of `capability`, None: the CPU) with its decoder linears in `weights` (spec.weights.dtype)."""
    model_dir = Path(model_dir)
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError("ModelUnreadable", f"cannot read {model_dir}/config.json: {exc}; "
                             "point spec.model at a saved transformers model directory") from exc
    if not isinstance(config, dict):
        raise ModelLoadError("ModelUnreadable", f"{model_dir}/config.json is not a JSON object; point spec.model "
                             "at a saved transformers model directory")
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ModelLoadError("ModelUnreadable", f"{model_dir} has no *.safetensors file; the worker "
                             "sizes and loads safetensors checkpoints only (re-save with safe_serialization)")
    tensors: dict[str, dict] = {}
    for file in files:
        tensors.update(read_safetensors_header(file))
    try:
        return shape_from(config, tensors, dtype, weights, capability)
    except UnsupportedPrecision as exc:
        raise ModelLoadError(exc.reason, f"{model_dir}: {exc}") from exc
    except (KeyError, TypeError, ValueError, ZeroDivisionError, AttributeError) as exc:  # numbers of the wrong kind
        raise ModelLoadError("ModelUnreadable", f"{model_dir}/config.json does not describe the checkpoint "
                             f"({type(exc).__name__}: {exc}); the worker supports decoder-only transformers "
                             "causal LMs") from exc


def shape_from(config: dict, tensors: dict[str, dict], dtype: str = "auto", weights: str = AUTO,
               capability: tuple[int, int] | None = None) -> ModelShape:
    """Pure: a ModelShape from a config.json dict and a safetensors tensor table (precision as read_shape's)."""
    quantized = checkpoint_quantization(config)
    if quantized is not None:
        raise ModelLoadError("UnsupportedQuantization", quantized_checkpoint_fix(quantized))
    text = config.get("text_config", config)
    precision = choose(capability, weights, _checkpoint_dtype(config, tensors))
    target = precision.compute if dtype == "auto" else dtype
    stored = precision.weights if precision.quantized else ""
    transposed = text.get("model_type") == "gpt2"  # GPT-2's Conv1D stores its weight [in, out]
    layers = _get(text, "num_hidden_layers", "n_layer")
    heads = _get(text, "num_attention_heads", "n_head")
    hidden = _get(text, "hidden_size", "n_embd")
    kv_heads = text.get("num_key_value_heads") or heads
    head_dim = text.get("head_dim") or hidden // heads
    intermediate = text.get("intermediate_size") or text.get("n_inner") or 4 * hidden
    embedding = other = 0
    per_layer = [0] * layers
    linears: set[tuple[int, int]] = set()
    for name, info in tensors.items():
        nbytes = _tensor_bytes(info, target)
        layer = _LAYER.search(name)
        if layer and int(layer.group(1)) < layers:
            if stored and _is_linear_weight(name, info):
                out, inp = reversed(info["shape"]) if transposed else info["shape"]
                linears.add((out, inp))
                nbytes = linear_weight_bytes(out, inp, stored, _TORCH_DTYPE_BYTES[target])
            per_layer[int(layer.group(1))] += nbytes
        elif _EMBEDDING.search(name):
            embedding += nbytes
        else:
            other += nbytes
    element = _TORCH_DTYPE_BYTES[target]
    return ModelShape(
        dtype=target, embedding_bytes=embedding, layer_bytes=tuple(per_layer),
        other_bytes=other,
        kv_bytes_per_token=kv_bytes_per_token(layers=layers, kv_heads=kv_heads, head_dim=head_dim, dtype_bytes=element),
        hidden_size=hidden, intermediate_size=intermediate, num_attention_heads=heads,
        num_key_value_heads=kv_heads, head_dim=head_dim, mlp_tensors=2 if text.get("model_type") == "gpt2" else 3,
        vocab_size=_get(text, "vocab_size"), weights=stored, linears=tuple(sorted(linears)),
    )


def _is_linear_weight(name: str, info: dict) -> bool:
    """A decoder layer's linear weight: a 2-D float tensor named *.weight (norms are 1-D, biases end in .bias)."""
    return name.endswith(".weight") and len(info["shape"]) == 2 and info["dtype"] in _FLOAT_DTYPES


def _get(config: dict, *keys: str) -> int:
    for key in keys:
        if config.get(key):
            return int(config[key])
    raise ModelLoadError("ModelUnreadable", f"config.json has none of {list(keys)}; the worker supports "
                         "decoder-only transformers causal LMs")


def _checkpoint_dtype(config: dict, tensors: dict[str, dict]) -> str:
    """The checkpoint's own float dtype: the one config.json declares, else its tensors'."""
    declared = config.get("dtype") or config.get("torch_dtype")
    if declared in _TORCH_DTYPE_BYTES:
        return declared
    stored = {info["dtype"] for info in tensors.values() if info["dtype"] in _FLOAT_DTYPES}
    return {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}.get(next(iter(sorted(stored)), "F32"), "float32")


def _tensor_bytes(info: dict, target: str) -> int:
    numel = 1
    for dim in info["shape"]:
        numel *= dim
    if info["dtype"] in _FLOAT_DTYPES:
        return numel * _TORCH_DTYPE_BYTES[target]
    return numel * _DTYPE_BYTES[info["dtype"]]
