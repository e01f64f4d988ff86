"""Host-to-device copies on a side stream, ordered by events; the same calls on CPU are plain copies.

Owns the only CUDA stream/event code in the worker. Elastic residency issues its
layer prefetches through a `Transfer`, so the CPU test suite runs the exact code
path a GPU runs (events and streams become no-ops; copies are synchronous memcpy).
"""
from __future__ import annotations

import torch


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
