"""Weight-only quantization of a loaded model's decoder linears: int8 and int4, on the CPU and on CUDA.

Owns `quantize_decoder` (and `device_capability`, what contract.precision's rule is given), called by the worker's loader and the profiler Job after the model loads in its
compute dtype (contract.precision chooses both dtypes): every nn.Linear (and GPT-2's Conv1D) inside the
decoder layers becomes a `QuantizedLinear`. Embeddings, the LM head, norms and biases stay in the compute
dtype. The stored bytes are exactly contract.footprint's `linear_weight_bytes`, so the planner, the admission
and the profiler count what the engine holds:
- int8: symmetric, one scale per output channel (torchao's per-channel affine quantization); the product
  is ATen's weight-only int8 kernel on the CPU (`_weight_int8pack_mm`), and on CUDA the linear dequantized
  into the compute dtype, then one matrix product (what torchao's Int8Tensor runs; that transient copy is
  the dequantization workspace contract.footprint adds to the overhead);
- int4: asymmetric groups (`int4_group_size`: 128, else 64 or 32) with a scale and a float zero each,
  torchao's tinygemm scheme (`groupwise_affine_quantize_tensor`), packed for ATen's int4 kernels: the CPU
  one (`_weight_int4pack_mm_for_cpu`) or CUDA's tinygemm (`_weight_int4pack_mm`, bfloat16, compute
  capability 8.0 or later), which torchao's int4 weight-only layouts call.
A linear whose shape the int4 layout cannot pack stays in the compute dtype (contract.footprint agrees).

Why plain tensors and not torchao's tensor subclasses: the residency modes pack a layer's tensors into one
flat byte buffer and point each parameter at a view of it (engine/residency), which needs parameters that
are plain tensors; and torchao 0.18's int4 layouts have no CPU kernel (its CPU layout was removed), while
ATen's is there. torchao still decides every quantized value and scale; the kernels are ATen's, which torchao
itself dispatches to.
"""
from __future__ import annotations

import torch
from torch import nn

from contract.footprint import int4_group_size

from .residency import decoder_layers


def device_capability(device: torch.device) -> tuple[int, int] | None:
    """The CUDA compute capability of `device`, None for the CPU: what contract.precision.choose is given."""
    if device.type != "cuda":
        return None
    return tuple(torch.cuda.get_device_capability(device))


def _inner_k_tiles(in_features: int) -> int:
    """The tinygemm layout's inner K tiles: in_features must be a multiple of 16 × tiles."""
    return next(t for t in (8, 4, 2) if in_features % (16 * t) == 0)


class QuantizedLinear(nn.Module):
    """y = x Wᵀ + b with W stored as int8 (per-channel scales) or int4 (grouped scales and zeros)."""

    def __init__(self, in_features: int, out_features: int, weights: str, group: int | None,
                 weight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None, layout: str):
        super().__init__()
        self.in_features, self.out_features, self.weights, self.group, self.layout = (
            in_features, out_features, weights, group, layout)
        self.weight = nn.Parameter(weight, requires_grad=False)   # int8 [out, in], or the packed int4 layout
        self.scales = nn.Parameter(scales, requires_grad=False)   # int8: [out]; int4: [in / group, out, 2]
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).contiguous()
        if self.weights == "int8":
            if flat.is_cuda:
                out = torch.mm(flat, self.weight.t().to(flat.dtype)) * self.scales
            else:
                out = torch.ops.aten._weight_int8pack_mm(flat, self.weight, self.scales)
        elif flat.is_cuda:
            out = torch.ops.aten._weight_int4pack_mm(flat, self.weight, self.group, self.scales)
        else:
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.weight, self.group, self.scales)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        group = f", group={self.group}" if self.group else ""
        return f"in={self.in_features}, out={self.out_features}, {self.weights}{group}, layout={self.layout}"


def _float_weight(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """(weight [out, in], bias) of a linear module (nn.Linear, or GPT-2's Conv1D, whose weight is [in, out])."""
    if isinstance(module, nn.Linear):
        return module.weight.data, None if module.bias is None else module.bias.data
    if type(module).__name__ == "Conv1D" and hasattr(module, "nf"):
        return module.weight.data.t(), None if module.bias is None else module.bias.data
    return None


def quantize_linear(weight: torch.Tensor, bias: torch.Tensor | None, weights: str,
                    device: torch.device) -> QuantizedLinear | None:
    """One linear quantized for `device` (its packed layout is the device's), kept in host memory; None when
    int4 cannot pack its shape (it stays as it is)."""
    from torchao.quantization.utils import dynamically_quantize_per_channel, groupwise_affine_quantize_tensor

    out_features, in_features = weight.shape
    dtype = weight.dtype
    if weights == "int8":
        q, scales, _ = dynamically_quantize_per_channel(weight.float(), -128, 127, torch.int8)
        return QuantizedLinear(in_features, out_features, "int8", None, q.contiguous(),
                               scales.to(dtype).contiguous(), bias, device.type)
    group = int4_group_size(out_features, in_features)
    if group is None:
        return None
    if device.type == "cuda":
        q, scales = groupwise_affine_quantize_tensor(weight.to(device, torch.bfloat16), 4, group, torch.bfloat16)
        packed = torch.ops.aten._convert_weight_to_int4pack(q.contiguous(), _inner_k_tiles(in_features)).cpu()
        scales = scales.cpu()
    else:
        q, scales = groupwise_affine_quantize_tensor(weight, 4, group, dtype)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).contiguous(), 1)
    return QuantizedLinear(in_features, out_features, "int4", group, packed, scales.contiguous(), bias, device.type)


@torch.no_grad()
def quantize_decoder(model: nn.Module, weights: str, device: torch.device) -> int:
    """Replace every linear inside the decoder layers of `model` (in host memory, in its compute dtype) by its
    `weights` (int8 or int4) QuantizedLinear for `device`. Returns how many linears were quantized."""
    if weights not in ("int8", "int4"):
        raise ValueError(f"weights {weights!r} is not int8 or int4")
    count = 0
    for layer in decoder_layers(model):
        for parent in list(layer.modules()):
            for name, child in list(parent.named_children()):
                found = _float_weight(child)
                if found is None:
                    continue
                quantized = quantize_linear(found[0], found[1], weights, device)
                if quantized is not None:
                    setattr(parent, name, quantized)
                    count += 1
    return count
