"""Host-to-device copies on a side stream, ordered by events; the same calls on CPU are plain copies.

Owns the worker's CUDA stream/event plumbing for copies. Elastic residency issues its
layer prefetches through a `Transfer`, so the CPU test suite runs the exact code
path a GPU runs (events and streams become no-ops; copies are synchronous memcpy).
`upload` and `download` are the engine's per-step host<->device copies: an upload never makes
the host wait, a download is a step's one host sync. `swap_allocations` is the one stream every swap-in allocates on, so the caching
allocator reuses an evicted model's blocks for the next one (blocks are reused only
on the stream that allocated them). Called by residency and the engine.
"""
from __future__ import annotations

import contextlib
import threading

import torch

_swap_streams: dict[int, "torch.cuda.Stream"] = {}
_swap_streams_lock = threading.Lock()


def swap_allocations(device: torch.device):
    """Context in which a swap-in copies and allocates: one stream per device, shared by the swap group
    (a no-op on CPU). Its work is synchronized before the model's own stream uses the memory."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    index = device.index if device.index is not None else torch.cuda.current_device()
    with _swap_streams_lock:
        stream = _swap_streams.get(index)
        if stream is None:
            stream = _swap_streams[index] = torch.cuda.Stream(device=device)
    return torch.cuda.stream(stream)


class NullEvent:
    """CPU stand-in for torch.cuda.Event: CPU copies are synchronous, so there is nothing to record or
    wait for; the label names the event for tracing."""

    def __init__(self, label: str = ""):
        self.label = label


class Transfer:
    """Issues copies on a side stream and orders them against the compute stream with events."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device=device) if self.cuda else None

    def event(self, label: str):
        """A new ordering event; `label` names it for tracing transfers."""
        return torch.cuda.Event() if self.cuda else NullEvent(label)

    def copy(self, dst: torch.Tensor, src: torch.Tensor, *, after, done) -> None:
        """Copy `src` into `dst` on the side stream once `after` has fired; `done` fires when it lands."""
        if not self.cuda:
            dst.copy_(src)
            return
        with torch.cuda.stream(self.stream):
            self.stream.wait_event(after)
            dst.copy_(src, non_blocking=True)
            done.record(self.stream)

    def compute_waits_for(self, event) -> None:
        """The compute (current) stream waits until `event` fired (a prefetch landed)."""
        if self.cuda:
            torch.cuda.current_stream(self.device).wait_event(event)

    def compute_marks(self, event) -> None:
        """Record `event` on the compute stream (a buffer is free once the work so far is done)."""
        if self.cuda:
            event.record(torch.cuda.current_stream(self.device))


def upload(values, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Host values (a list or a host tensor) onto `device` without a host sync: staged in pinned memory,
    copied asynchronously."""
    host = values.to(dtype) if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
    if device.type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)


def download(tensor: torch.Tensor) -> torch.Tensor:
    """A device tensor's values on the host: the one device-to-host copy (and host sync) of a step."""
    return tensor.to("cpu", copy=True)
