"""The engine's typed errors: a PascalCase `reason` and a message that says what failed, why and the fix.

Raised by the device ledger (memory.py) and caught by the decode graphs (forward/graphs.py);
the worker reports them in a model's verdict (a RuntimeError, so a load that raises one refuses
that model alone).
"""
from __future__ import annotations


class EngineError(RuntimeError):
    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


class BudgetExceeded(EngineError):
    """Placing a tensor would take a model's device bytes past its budget."""
