"""Limits that contradict each other or the budget are refused at `gpushare validate`, at the field, with the fix:
spec.memoryBudget must lie within [minBudget, maxBudget] (docs/guide.md, "The rules"). And the loop never takes a
budget below the measured peak plus headroom because of a limit: it holds (AtMaxBudget, MaxBudgetBelowUsage)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from controller.cli.commands import main
from controller.inputs.load import parse_model
from controller.inputs.rightsizing_records import Record
from controller.policy import Rightsizing
from controller.rightsizing.step import step
from controller.rightsizing.usage import Sample
from controller.types import Source
from factories import toy_model

GiB = 1 << 30


def _doc(budget, **rightsizing) -> dict:
    return {"apiVersion": "gpushare.dev/v1alpha1", "kind": "ElasticModel",
            "metadata": {"name": "chat", "namespace": "llm"},
            "spec": {"model": "org/chat", "memoryBudget": budget, "rightsizing": {"policy": "Auto", **rightsizing}}}


CONTRADICTIONS = [  # (id, memoryBudget, limits, the field, words of the fix)
    ("max-below-the-budget", "24Gi", dict(maxBudget="12Gi"), "spec.rightsizing.maxBudget",
     "raise maxBudget to at least 24Gi"),
    ("min-above-the-budget", "8Gi", dict(minBudget="12Gi"), "spec.rightsizing.minBudget",
     "lower minBudget to at most 8Gi"),
    ("min-above-max", "8Gi", dict(minBudget="16Gi", maxBudget="4Gi"), "spec.rightsizing.minBudget",
     "set minBudget at most maxBudget"),
    ("max-below-a-budget-in-bytes", 25769803776, dict(maxBudget=12884901888), "spec.rightsizing.maxBudget",
     "raise maxBudget to at least 24Gi"),
]


@pytest.mark.parametrize("budget,limits,path,fix", [c[1:] for c in CONTRADICTIONS], ids=[c[0] for c in CONTRADICTIONS])
def test_contradictory_limits_are_refused_at_the_field_with_the_fix(budget, limits, path, fix):
    model, errors = parse_model(_doc(budget, **limits), Source("models/chat.yaml"))
    assert model is None and [(e.reason, e.path) for e in errors] == [("InvalidRightsizing", path)]
    assert fix in errors[0].fix


@pytest.mark.parametrize("limits", [dict(minBudget="2Gi", maxBudget="32Gi"), dict(minBudget="8Gi", maxBudget="8Gi"),
                                    dict(maxBudget="8Gi"), dict(minBudget="8Gi"), {}],
                         ids=["around-the-budget", "a-fixed-budget", "max-at-the-budget", "min-at-the-budget", "none"])
def test_limits_around_the_budget_are_allowed(limits):
    model, errors = parse_model(_doc("8Gi", **limits), Source("models/chat.yaml"))
    assert errors == [] and model is not None


def test_validate_refuses_the_issues_limits_and_names_the_field_and_the_fix(tmp_path, capsys):
    """memoryBudget 24Gi with maxBudget 12Gi passed `validate`; the loop then shrank a steady 16 GiB model to 12 GiB."""
    models = tmp_path / "models"
    models.mkdir()
    (models / "chat.yaml").write_text(
        "apiVersion: gpushare.dev/v1alpha1\nkind: ElasticModel\nmetadata:\n  name: chat\n  namespace: llm\nspec:\n"
        "  model: org/chat\n  memoryBudget: 24Gi\n  rightsizing:\n    policy: Auto\n    maxBudget: 12Gi\n")
    assert main(["validate", str(models / "chat.yaml")]) == 1
    out = capsys.readouterr().out
    assert "at spec.rightsizing.maxBudget: [InvalidRightsizing] maxBudget 12Gi is below memoryBudget (24Gi)" in out
    assert "Fix: raise maxBudget to at least 24Gi, or lower memoryBudget to 12Gi yourself" in out


def test_a_ceiling_below_the_peak_plus_headroom_holds_instead_of_cutting_the_budget():
    """An Auto budget of 20 GiB (the loop upsized it) and a maxBudget lowered since to 12 GiB, with a steady 16 GiB
    peak: the loop does not shrink the budget to 12 GiB, below what the model uses; it holds and says why."""
    policy = Rightsizing(policy="Auto", max_budget=12 * GiB, downsize_after_s=3600, cooldown_s=0)
    model = replace(toy_model("chat", 8 * GiB), rightsizing=policy)
    record = Record("llm", "chat", "Auto", 8 * GiB, 20 * GiB, "up", "OutOfMemory", "2027-01-14T00:00:00Z")
    samples = [Sample(time=1_800_000_000.0 + 60 * i, model="llm/chat", device_bytes=16 * GiB) for i in range(240)]
    result = step([model], (), [], {record.key: record}, {"llm/chat": samples}, samples[-1].time + 60, window_s=7200)
    held = result.records[("llm", "chat")]
    assert held.budget_bytes == 20 * GiB and held.at == record.at  # no change
    condition = next(c for c in held.conditions if c.type == "AtMaxBudget")
    assert condition.reason == "MaxBudgetBelowUsage"
    assert "maxBudget (12.0Gi) is below the peak" in condition.message and "at least 18.5Gi" in condition.message
