"""The precision a profile measures: contract.precision's rule applied to the model the Job loaded.

Owns `apply_precision`: the compute dtype and the weight dtype that the worker would choose for this model on
this GPU (the device's CUDA compute capability; on a CPU run, the catalog's capability of --gpu-product, the
GPU the profile is for), the model cast to that compute dtype, and its decoder linears quantized through the
worker's own quantizer (engine/quantize.py, reached lazily as measure/engine.py reaches the engine), so the
weights the profile measures are byte for byte the ones the worker will hold. Called by profiler_job.run.
"""
from __future__ import annotations

from typing import Any

from contract.precision import Precision, UnsupportedPrecision, choose
from profiler_job.errors import UnsupportedWeightDtype


def apply_precision(model: Any, *, weights: str, dtype: str, capability: tuple[int, int] | None, product: str,
                    device: str) -> Precision:
    """Cast and quantize `model` (loaded in its checkpoint's dtype, or --dtype) for `product`; returns the
    precision applied. UnsupportedWeightDtype when the GPU cannot run `weights`."""
    import torch

    loaded = str(next(model.parameters()).dtype).removeprefix("torch.")
    try:
        precision = choose(capability, weights, loaded, product)
    except UnsupportedPrecision as exc:
        raise UnsupportedWeightDtype(str(exc)) from exc
    compute = precision.compute if dtype == "auto" else dtype
    if compute != loaded:
        model.to(getattr(torch, compute))
    if precision.quantized:
        from engine.quantize import quantize_decoder

        quantize_decoder(model, precision.weights, torch.device(device))
        model.to(device)  # the quantized linears are made in host memory
    return Precision(compute, precision.weights if precision.quantized else compute)
