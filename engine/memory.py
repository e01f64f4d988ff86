"""Device memory: what the slot really has, and what each model has placed there.

`available_bytes` combines the configured capacity with a probe of free device
memory (torch.cuda.mem_get_info, else pynvml); the probe is a function passed in
so tests and CPU runs swap it. `DeviceLedger` is every model's account of the
device bytes it placed: residency modes allocate through it, and it refuses any
placement that would pass the model's budget. Called by the runtime and residency.
"""
from __future__ import annotations

import threading
from typing import Callable

import torch

from contract.quantity import format_bytes

from .errors import BudgetExceeded

FreeBytesProbe = Callable[[], int | None]


def cuda_free_bytes(device_index: int = 0) -> int | None:
    """Free bytes on the CUDA device per the driver; None when neither torch nor NVML can tell."""
    if torch.cuda.is_available():
        free, _total = torch.cuda.mem_get_info(device_index)
        return int(free)
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(device_index)).free)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no driver or library: the configured capacity is all we know
        return None


def no_probe() -> int | None:
    """CPU: nothing to probe; the configured capacity is the memory."""
    return None


def available_bytes(capacity_bytes: int, probe: FreeBytesProbe) -> int:
    """The smaller of the configured capacity and the free bytes the probe reports."""
    free = probe()
    return capacity_bytes if free is None else min(capacity_bytes, free)


def tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class DeviceLedger:
    """The device bytes one model holds: placed tensors plus reservations (KV cache, activations).

    Every device tensor a residency mode creates comes from `place`/`empty`, so
    `placed_bytes` is a measured count, and `holds` tells device tensors from host ones
    even on CPU where both live in RAM.
    """

    def __init__(self, model: str, budget_bytes: int, device: torch.device):
        self.model = model
        self.budget_bytes = budget_bytes
        self.device = device
        self._tensors: dict[int, int] = {}  # data_ptr -> bytes
        self._reserved: dict[str, int] = {}
        self._lock = threading.Lock()
        self.peak_bytes = 0

    @property
    def placed_bytes(self) -> int:
        return sum(self._tensors.values())

    @property
    def total_bytes(self) -> int:
        return self.placed_bytes + sum(self._reserved.values())

    def reserved(self, label: str) -> int:
        """Bytes held by the reservation `label` ("kv-cache", "activation"), 0 when none."""
        return self._reserved.get(label, 0)

    def reserve(self, label: str, nbytes: int) -> None:
        with self._lock:
            self._charge(nbytes - self._reserved.get(label, 0), label)
            self._reserved[label] = nbytes

    def empty(self, nbytes: int, dtype: torch.dtype = torch.uint8, *, what: str = "buffer") -> torch.Tensor:
        """A new uninitialised flat device tensor of `nbytes`, charged to this model (`what`: for the message)."""
        with self._lock:
            self._charge(nbytes, what)
            t = torch.empty(nbytes // torch.empty((), dtype=dtype).element_size(), dtype=dtype, device=self.device)
            self._record(t)
            return t

    def place(self, host: torch.Tensor, *, non_blocking: bool = False) -> torch.Tensor:
        """A device copy of `host` (always a new allocation, even on CPU), charged to this model."""
        nbytes = tensor_bytes(host)
        with self._lock:
            self._charge(nbytes, "weights")
            t = torch.empty_like(host, device=self.device)
            t.copy_(host, non_blocking=non_blocking)
            self._record(t)
            return t

    def release_all(self) -> None:
        """Forget every placed tensor (the caller has dropped its references); reservations stay."""
        with self._lock:
            self._tensors.clear()

    def holds(self, t: torch.Tensor) -> bool:
        """Whether `t` lies in memory this ledger placed (views of a placed buffer included)."""
        ptr = t.untyped_storage().data_ptr()
        return ptr in self._tensors

    def _record(self, t: torch.Tensor) -> None:
        self._tensors[t.untyped_storage().data_ptr()] = tensor_bytes(t)
        self.peak_bytes = max(self.peak_bytes, self.total_bytes)

    def _charge(self, nbytes: int, what: str) -> None:
        if self.total_bytes + nbytes > self.budget_bytes:
            raise BudgetExceeded(
                "BudgetExceeded",
                f"{self.model}: placing {format_bytes(nbytes)} of {what} would hold "
                f"{format_bytes(self.total_bytes + nbytes)} on the device, over the budget of "
                f"{format_bytes(self.budget_bytes)}; admission under-estimated this model: raise memoryBudget",
            )
