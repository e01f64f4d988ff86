"""Resident mode: every weight and buffer on the device, for the worker's lifetime."""
from __future__ import annotations

from .base import Residency, place_all


class ResidentResidency(Residency):
    mode = "resident"

    def load(self) -> None:
        place_all(self.model, self.ledger)
