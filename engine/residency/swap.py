"""Swap mode: master weights in (pinned) host memory; a device copy only while the model is active.

The scheduler activates one model of the swap group at a time after the previous
one drained. Deactivation drops the device copy without copying back: the host
copy is the master and inference never writes weights.
"""
from __future__ import annotations

import torch

from .base import Residency, place_all


class SwapResidency(Residency):
    mode = "swap"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._host_params: list[tuple[torch.nn.Parameter, torch.Tensor]] = []
        self._host_buffers: list[tuple[torch.nn.Module, str, torch.Tensor]] = []
        self._active = False

    @property
    def on_device(self) -> bool:
        return self._active

    def load(self) -> None:
        for param in self.model.parameters():
            param.data = _pinned(param.data, self.pin)
            self._host_params.append((param, param.data))
        for module in self.model.modules():
            for key, buf in module._buffers.items():
                if buf is not None:
                    module._buffers[key] = _pinned(buf, self.pin)
                    self._host_buffers.append((module, key, module._buffers[key]))

    def activate(self) -> None:
        if self._active:
            return
        place_all(self.model, self.ledger, non_blocking=self.pin)
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        self._active = True

    def unload(self) -> None:
        self._host_params, self._host_buffers, self._active = [], [], False
        super().unload()

    def deactivate(self) -> None:
        for param, host in self._host_params:
            param.data = host
        for module, key, host in self._host_buffers:
            module._buffers[key] = host
        self.ledger.release_all()
        self._active = False


def _pinned(t: torch.Tensor, pin: bool) -> torch.Tensor:
    """`t` in page-locked host memory when `pin` (CUDA present), else unchanged."""
    return t.pin_memory() if pin else t
