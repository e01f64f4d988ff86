"""The residency interface and the weight placement every mode shares.

Owns `Residency` (the base the scheduler, the runtime, the engine's forward passes and the batch use: load,
activate/deactivate, unload, the layer gates) and the helpers the modes place weights with: the decoder-layer
list, the packing order and offsets of a layer's parameters, and `place_all` (every weight through the
model's DeviceLedger). A module of its own so that the modes (resident.py, swap.py, elastic.py) import it
rather than the package, whose `make_residency` imports them.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from ..memory import DeviceLedger


class Residency:
    """Base: holds the model, its ledger and device; modes override load/activate/deactivate."""

    mode = "resident"

    def __init__(self, model: nn.Module, ledger: DeviceLedger, device: torch.device, *, pin: bool):
        self.model = model
        self.ledger = ledger
        self.device = device
        self.pin = pin
        self.on_streamed_bytes: Callable[[int], None] = lambda n: None

    @property
    def on_device(self) -> bool:
        """Whether requests can run now (swap models only after activate)."""
        return True

    def load(self) -> None:
        raise NotImplementedError

    def activate(self) -> None:
        """Swap: bring the weights onto the device. Other modes are always active."""

    def deactivate(self) -> None:
        """Swap: drop the device copy (the host copy is the master). Other modes never leave."""

    def unload(self) -> None:
        """The model is retired: drop every weight and buffer (device and host) and forget the ledger's
        tensors, so the memory is free now, whoever still holds the model object."""
        for param in self.model.parameters():
            param.data = torch.empty(0, dtype=param.dtype)
        for module in self.model.modules():
            for key, buf in module._buffers.items():
                if buf is not None:
                    module._buffers[key] = torch.empty(0, dtype=buf.dtype)
        self.ledger.release_all()

    # Layer gates: a forward that runs the decoder layers itself (engine/forward/decoder.py) calls these
    # around the pass and each layer; elastic streams layers through them. transformers' modules reach the
    # same gates through forward hooks.
    def start_pass(self) -> None:
        """A forward pass begins."""

    def enter_layer(self, index: int) -> None:
        """Decoder layer `index` is about to run: its weights must be on the device when this returns."""

    def leave_layer(self, index: int) -> None:
        """Decoder layer `index` has been issued."""

    def device_resident_layers(self) -> list[int]:
        """Indices of decoder layers whose every parameter lies in device memory this model placed."""
        return [i for i, layer in enumerate(decoder_layers(self.model))
                if all(self.ledger.holds(p) for p in layer.parameters())]


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder-layer list: the ModuleList whose length is the config's layer count."""
    count = model.config.get_text_config().num_hidden_layers
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) == count:
            return module
    raise ValueError(f"{type(model).__name__} has no ModuleList of {count} decoder layers")


def pack_order(module: nn.Module) -> list[nn.Parameter]:
    """A layer's parameters in the order they are packed: largest element size first (every offset is then
    a multiple of its tensor's element size, with no padding), matrices before vectors, else the order the
    module registered them. So q, k and v (and gate and up, and the q, k, v biases) lie side by side and the
    decoder forward reads each group as one merged projection (engine/forward/decoder.py)."""
    return sorted(module.parameters(), key=lambda p: (-p.element_size(), -p.dim()))


def views_at(flat: torch.Tensor, params: list[nn.Parameter], offsets: list[int]) -> list[torch.Tensor]:
    """Views of the byte tensor `flat` shaped and typed like `params`, starting at `offsets`."""
    return [flat[off: off + p.numel() * p.element_size()].view(p.dtype).view(p.shape)
            for p, off in zip(params, offsets)]


def packed_offsets(params: list[nn.Parameter]) -> tuple[list[int], int]:
    """Each parameter's byte offset when packed densely in this order, and the total bytes."""
    offsets, total = [], 0
    for p in params:
        offsets.append(total)
        total += p.numel() * p.element_size()
    return offsets, total


def place_all(model: nn.Module, ledger: DeviceLedger, *, non_blocking: bool = False,
              skip: set[int] = frozenset()) -> None:
    """Point every parameter and buffer (except those whose id is in `skip`) at a ledger-placed device copy.
    Each decoder layer placed whole lands in one allocation, packed in `pack_order`."""
    packed: set[int] = set()
    for layer in decoder_layers(model):
        params = pack_order(layer)
        if params and not any(id(p) in skip for p in params):
            offsets, total = packed_offsets(params)
            flat = ledger.empty(total, what="weights")
            for p, view in zip(params, views_at(flat, params, offsets)):
                view.copy_(p.data, non_blocking=non_blocking)
                p.data = view
            packed.update(id(p) for p in params)
    for param in model.parameters():
        if id(param) not in skip and id(param) not in packed:
            param.data = ledger.place(param.data, non_blocking=non_blocking)
    for module in model.modules():
        for key, buf in module._buffers.items():
            if buf is not None and id(buf) not in skip and not ledger.holds(buf):
                module._buffers[key] = ledger.place(buf, non_blocking=non_blocking)
