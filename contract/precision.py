"""Precision: which weight dtypes exist, and the one rule that says what a device runs them in.

Owns the names an ElasticModel's `spec.weights.dtype` may take (schemas/elasticmodel.schema.json lists
the same, aliases included), their canonical form, and `choose`: from a device's CUDA compute capability
(None on the CPU), the weight dtype asked for and the checkpoint's own float dtype, the compute dtype
(activations, KV cache, embeddings, LM head, norms, biases, quantization scales) and the dtype of the
decoder layers' linear weights. The profiler Job and the worker both load through `choose`, so a profile
measures what the worker serves; the controller's `validate` asks `product_problem` about a GPU product
whose capability the catalog knows (contract.gpu_catalog).

The rules:
- A GPU below compute capability 8.0 (Volta, Turing: e.g. Tesla-T4, 7.5) has no bfloat16: a bfloat16
  checkpoint runs in float16 there, and asking for bfloat16 is refused.
- int8 (weight-only, one scale per output channel) runs on every device, in the compute dtype above.
- int4 (weight-only, groups of 128 with a scale and a zero each) runs on the CPU, and on a GPU only from
  compute capability 8.0 on, in bfloat16: the int4 matrix kernel (ATen's tinygemm, which torchao's int4
  weight-only layout calls) takes bfloat16 activations and needs Ampere or later.
- `auto` (or no `spec.weights`) is the checkpoint's own precision: nothing is quantized.
Pure: no torch.
"""
from __future__ import annotations

from dataclasses import dataclass

AUTO = "auto"
FLOAT_DTYPES = ("bfloat16", "float16", "float32")
QUANTIZED_DTYPES = ("int8", "int4")
WEIGHT_DTYPES = (AUTO, "bfloat16", "float16", "int8", "int4")  # the canonical names spec.weights.dtype takes
ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16"}
ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
BF16_MIN_CAPABILITY = (8, 0)   # bfloat16 arithmetic: Ampere and later
INT4_MIN_CAPABILITY = (8, 0)   # the tinygemm int4 matrix kernel: Ampere and later, bfloat16 activations


class UnsupportedPrecision(ValueError):
    """A weight dtype this device cannot run; the message names the device and the fix."""

    reason = "UnsupportedWeightDtype"


@dataclass(frozen=True)
class Precision:
    compute: str   # torch dtype name of activations, KV cache, embeddings, head, norms, biases and scales
    weights: str   # the decoder layers' linear weights: the compute dtype, int8 or int4

    @property
    def quantized(self) -> bool:
        return self.weights in QUANTIZED_DTYPES


def canonical(name: str | None) -> str:
    """The canonical weight dtype of a spec value or worker config value (None and `auto`: AUTO)."""
    if name is None:
        return AUTO
    name = ALIASES.get(name, name)
    if name not in WEIGHT_DTYPES:
        raise UnsupportedPrecision(f"weight dtype {name!r} is not one of {', '.join(WEIGHT_DTYPES)} "
                                   f"(aliases: {', '.join(sorted(ALIASES))})")
    return name


def has_bfloat16(capability: tuple[int, int] | None) -> bool:
    """Whether the device computes in bfloat16 (the CPU does; a GPU from compute capability 8.0)."""
    return capability is None or tuple(capability) >= BF16_MIN_CAPABILITY


def _where(capability: tuple[int, int] | None, device: str) -> str:
    return "the CPU" if capability is None else f"{device} (compute capability {capability[0]}.{capability[1]})"


def choose(capability: tuple[int, int] | None, weights: str | None, checkpoint: str,
           device: str = "this GPU") -> Precision:
    """The precision a device runs a model in. `capability`: (major, minor) of the CUDA device, None for the CPU;
    `weights`: the weight dtype asked for (AUTO: the checkpoint's own); `checkpoint`: the checkpoint's float
    dtype (bfloat16, float16 or float32); `device`: how messages name the device. UnsupportedPrecision when the
    device cannot run the weights asked for."""
    weights = canonical(weights)
    problem = capability_problem(capability, weights, device)
    if problem:
        raise UnsupportedPrecision(f"{problem[0]}; fix: {problem[1]}")
    native = checkpoint if checkpoint in FLOAT_DTYPES else "float32"
    if native == "bfloat16" and not has_bfloat16(capability):
        native = "float16"
    if weights in ("bfloat16", "float16"):
        return Precision(weights, weights)
    if weights == "int4" and capability is not None:
        return Precision("bfloat16", "int4")
    if weights in QUANTIZED_DTYPES:
        return Precision(native, weights)
    return Precision(native, native)


def capability_problem(capability: tuple[int, int] | None, weights: str,
                       device: str = "this GPU") -> tuple[str, str] | None:
    """(why, fix) when a device of `capability` cannot run `weights` (canonical); None when it can."""
    if weights == "bfloat16" and not has_bfloat16(capability):
        return (f"bfloat16 needs compute capability {BF16_MIN_CAPABILITY[0]}.{BF16_MIN_CAPABILITY[1]} or later and "
                f"{_where(capability, device)} is older",
                "set spec.weights.dtype to float16 or int8, or remove spec.weights (a bfloat16 checkpoint then "
                "runs in float16)")
    if weights == "int4" and capability is not None and tuple(capability) < INT4_MIN_CAPABILITY:
        return (f"int4 weights need compute capability {INT4_MIN_CAPABILITY[0]}.{INT4_MIN_CAPABILITY[1]} or later "
                f"(the int4 matrix kernel runs bfloat16 activations) and {_where(capability, device)} is older",
                "set spec.weights.dtype to int8, or run the model on a newer GPU product")
    return None


def product_problem(product: str, capability: tuple[int, int] | None, weights: str) -> tuple[str, str] | None:
    """capability_problem for a GPU product (its catalog capability; None: not known, nothing to check)."""
    if capability is None:
        return None
    return capability_problem(capability, weights, product)


def checkpoint_quantization(config: dict) -> str | None:
    """What a pre-quantized checkpoint's config.json says of its weights (`quantization_config`), in words
    (e.g. "gptq 4-bit, group 128"); None for a checkpoint in a float dtype. The worker and the profiler refuse
    such a checkpoint with these words (UnsupportedQuantization): its packed layout is its library's own."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    quant = config.get("quantization_config") or text.get("quantization_config")
    if not isinstance(quant, dict):
        return None
    method = str(quant.get("quant_method") or quant.get("quant_type") or "unknown method")
    if quant.get("load_in_4bit") or quant.get("load_in_8bit"):
        return f"{method} {'4' if quant.get('load_in_4bit') else '8'}-bit"
    groups = quant.get("config_groups")
    if isinstance(groups, dict):  # compressed-tensors: each group's weights block
        bits = sorted({str((g.get("weights") or {}).get("num_bits")) for g in groups.values() if isinstance(g, dict)})
        return f"{method} {'/'.join(bits)}-bit"
    bits = quant.get("bits") or quant.get("w_bit") or quant.get("weight_bits")
    group = quant.get("group_size") or quant.get("q_group_size")
    detail = f" {bits}-bit" if bits else ""
    kind = quant.get("quant_type")
    if not bits and isinstance(kind, dict):  # torchao: {"default": {"_type": "Int8WeightOnlyConfig", ...}}
        kind = next((v.get("_type") for v in kind.values() if isinstance(v, dict) and v.get("_type")), None)
    if not bits and isinstance(kind, str) and kind != method:
        detail = f" {kind}"
    return f"{method}{detail}" + (f", group {group}" if group else "")


def quantized_checkpoint_fix(described: str) -> str:
    """The refusal of a pre-quantized checkpoint, with the fix."""
    return (f"the checkpoint is already quantized ({described}, from its config.json quantization_config); this "
            "engine loads float checkpoints and quantizes them itself: point spec.model at the float "
            "(bfloat16/float16) checkpoint and set spec.weights.dtype to int8 or int4")
