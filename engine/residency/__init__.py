"""Residency modes: how a loaded model's weights occupy the device.

`Residency` (base.py) is the interface the scheduler and runtime use; `make_residency` picks
resident.py, swap.py or elastic.py by the configured mode. Each mode allocates
device memory only through the model's DeviceLedger.
"""
from __future__ import annotations

import torch
from torch import nn

from ..memory import DeviceLedger
from .base import Residency, decoder_layers
from .elastic import ElasticResidency
from .resident import ResidentResidency
from .swap import SwapResidency

__all__ = ["Residency", "decoder_layers", "make_residency"]


def make_residency(mode: str, model: nn.Module, ledger: DeviceLedger, device: torch.device, *,
                   resident_layers: int | None = None) -> Residency:
    pin = device.type == "cuda"
    if mode == "resident":
        return ResidentResidency(model, ledger, device, pin=pin)
    if mode == "swap":
        return SwapResidency(model, ledger, device, pin=pin)
    if mode == "elastic":
        return ElasticResidency(model, ledger, device, pin=pin, resident_layers=resident_layers or 0)
    raise ValueError(f"unknown mode {mode!r}")
