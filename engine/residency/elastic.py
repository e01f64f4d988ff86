"""Elastic mode: the first `resident_layers` decoder layers (plus embeddings, norm, head) stay on
the device; every other layer lives packed in (pinned) host memory and is copied into one of
TWO device buffers on a side stream, one layer ahead of compute, ordered by events.

Mechanics: the layer gates (`start_pass`, `enter_layer`, `leave_layer`, called by the worker's own
forward; forward hooks on the transformers modules call the same code) wait for the layer's copy, point its
parameters at views of the buffer, and start copying the next streamed layer into the other
buffer once the layer that last used it has finished (its "free" event). The first layer's copy
for the next pass starts as soon as its buffer is free, when the last layer of this pass on that
buffer has been issued, so it overlaps the end of this pass, the sampling and the host work
between steps (the first pass starts it at its start, overlapping embeddings and resident
layers). After a
streamed layer runs, its parameters point back at host memory. On CPU the Transfer makes the
same calls synchronous, so tests exercise this path.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..transfer import Transfer
from .base import Residency, decoder_layers, pack_order, packed_offsets, place_all, views_at


@dataclass
class _StreamedLayer:
    index: int  # position among all decoder layers
    params: list[nn.Parameter]
    host: torch.Tensor  # packed bytes in (pinned) host memory
    offsets: list[int]  # each parameter's byte offset in `host` and in a buffer
    host_views: list[torch.Tensor]
    device_views: list[list[torch.Tensor]]  # per buffer, one view per parameter
    copied: object = None  # event: this layer's bytes landed in its buffer


class ElasticResidency(Residency):
    mode = "elastic"

    def __init__(self, *args, resident_layers: int, transfer: Transfer | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.resident_layers = resident_layers
        self.transfer = transfer or Transfer(self.device)
        self.streamed: list[_StreamedLayer] = []
        self.buffers: list[torch.Tensor] = []
        self._freed: list[object] = []  # per buffer: compute finished with its last layer
        self._ahead = False  # the next pass's first streamed layer is already being copied

    def load(self) -> None:
        layers = decoder_layers(self.model)
        streamed_modules = list(layers)[self.resident_layers:]
        streamed_params = {id(p) for m in streamed_modules for p in m.parameters()}
        place_all(self.model, self.ledger, skip=streamed_params)
        packed = [self._pack(self.resident_layers + j, m) for j, m in enumerate(streamed_modules)]
        if not packed:
            return
        size = max(layer.host.numel() for layer in packed)
        self.buffers = [self.ledger.empty(size) for _ in range(2)]
        self._freed = [self.transfer.event("free:init") for _ in range(2)]
        for event in self._freed:
            self.transfer.compute_marks(event)
        for layer in packed:
            layer.device_views = [views_at(buf, layer.params, layer.offsets) for buf in self.buffers]
        self.streamed = packed
        self.model.register_forward_pre_hook(lambda module, args: self.start_pass())
        for j, module in enumerate(streamed_modules):
            module.register_forward_pre_hook(lambda module, args, j=j: self._enter(j))
            module.register_forward_hook(lambda module, args, out, j=j: self._leave(j))

    def unload(self) -> None:
        self.streamed, self.buffers = [], []
        super().unload()

    def start_pass(self) -> None:
        if self.streamed and not self._ahead:
            self._prefetch(0)
        self._ahead = False

    def enter_layer(self, index: int) -> None:
        if index >= self.resident_layers:
            self._enter(index - self.resident_layers)

    def leave_layer(self, index: int) -> None:
        if index >= self.resident_layers:
            self._leave(index - self.resident_layers)

    def _pack(self, index: int, module: nn.Module) -> _StreamedLayer:
        """One layer's parameters packed densely in `pack_order`: the packed layer is exactly its weight
        bytes, the streaming buffer the footprint arithmetic (contract.footprint) planned."""
        params = pack_order(module)
        offsets, total = packed_offsets(params)
        host = torch.empty(total, dtype=torch.uint8, pin_memory=self.pin)
        layer = _StreamedLayer(index=index, params=params, host=host, offsets=offsets,
                               host_views=views_at(host, params, offsets), device_views=[])
        for p, view in zip(params, layer.host_views):
            view.copy_(p.data)
            p.data = view
        return layer

    def _prefetch(self, j: int) -> None:
        """Copy streamed layer j into buffer j % 2 once that buffer's previous user finished."""
        layer, b = self.streamed[j], j % 2
        layer.copied = self.transfer.event(f"copied:{layer.index}")
        self.transfer.copy(self.buffers[b][: layer.host.numel()], layer.host, after=self._freed[b], done=layer.copied)
        self.on_streamed_bytes(layer.host.numel())

    def _enter(self, j: int) -> None:
        layer = self.streamed[j]
        self.transfer.compute_waits_for(layer.copied)
        for p, view in zip(layer.params, layer.device_views[j % 2]):
            p.data = view
        if j + 1 < len(self.streamed):
            self._prefetch(j + 1)

    def _leave(self, j: int) -> None:
        layer = self.streamed[j]
        self._freed[j % 2] = self.transfer.event(f"free:{layer.index}")
        self.transfer.compute_marks(self._freed[j % 2])
        for p, view in zip(layer.params, layer.host_views):
            p.data = view
        if j == (len(self.streamed) - 1) // 2 * 2:  # the pass's last layer on buffer 0: the next pass's first
            self._prefetch(0)
            self._ahead = True

