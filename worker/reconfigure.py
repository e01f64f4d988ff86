"""In-place reconfiguration, pure: what a changed worker config asks of each model.

A model whose entry is identical keeps serving untouched. An entry whose only changes are
the budget or the SLO is retuned in place (its ledger's budget, its stream priority) when
its layout stays the same; any other change (mode, resident layers, context, concurrency,
model files, dtype) re-lays the model out: it drains, frees its memory and loads again.
Removed models drain and free; added models load beside the others. A slot or device
change cannot be applied in place. Called by worker.runtime.Worker.apply; the file watch
that calls it lives in worker/watch.py.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .config import ModelConfig, WorkerConfig

RETUNABLE = ("budget_bytes", "ttft_ms", "tpot_ms")  # fields a model can change without moving a byte


@dataclass(frozen=True)
class ConfigDiff:
    unchanged: tuple[str, ...]
    retuned: tuple[ModelConfig, ...]  # new entries whose budget or SLO changed
    relaid: tuple[ModelConfig, ...]  # new entries that must drain and load again
    added: tuple[ModelConfig, ...]
    removed: tuple[str, ...]
    restart_needed: str | None  # why the change cannot be applied in place

    def summary(self) -> str:
        parts = [f"{len(names)} {what}" for what, names in (
            ("unchanged", self.unchanged), ("retuned", self.retuned), ("re-laid-out", self.relaid),
            ("added", self.added), ("removed", self.removed)) if names]
        return ", ".join(parts) or "no change"


def diff(old: WorkerConfig, new: WorkerConfig) -> ConfigDiff:
    restart = None
    if (old.slot_id, old.product, old.capacity_bytes, old.device) != (new.slot_id, new.product, new.capacity_bytes,
                                                                     new.device):
        restart = "the slot or device changed; the worker must restart to apply it"
    unchanged, retuned, relaid, added = [], [], [], []
    for model in new.models:
        previous = old.model(model.name)
        if previous is None:
            added.append(model)
        elif previous == model:
            unchanged.append(model.name)
        elif _same_layout(previous, model):
            retuned.append(model)
        else:
            relaid.append(model)
    removed = tuple(m.name for m in old.models if new.model(m.name) is None)
    return ConfigDiff(tuple(unchanged), tuple(retuned), tuple(relaid), tuple(added), removed, restart)


def _same_layout(old: ModelConfig, new: ModelConfig) -> bool:
    keep = {field: getattr(old, field) for field in RETUNABLE}
    return replace(new, **keep) == old
