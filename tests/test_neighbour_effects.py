"""The review shows a change's effect on every model it touches, neighbours included: PLAN.md (and the pull request
body, which carries its summary and change lines) and the commit message show each prediction and SLO verdict
before → after, and the summary counts the models affected. Golden files under tests/golden/effects/<case>/ hold
PLAN.md and the commit message of the second of two passes over examples/fleet; regenerate them with
    UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/test_neighbour_effects.py -q
"""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from controller.passes.reconcile import PassOutput
from controller.rendering.planmd import review_summary
from tests.conftest import REPO_ROOT
from tests.test_planmd_jobs import apply  # a pass written back into the tree, as a commit leaves it

FLEET = REPO_ROOT / "examples" / "fleet"
GOLDEN = Path(__file__).resolve().parent / "golden" / "effects"
NEIGHBOUR = """apiVersion: gpushare.dev/v1alpha1
kind: ElasticModel
metadata:
  name: drafter
  namespace: llm
spec:
  model: meta-llama/Llama-3.1-8B-Instruct
  memoryBudget: 20Gi
  slo:
    contextTokens: 8192
    concurrency: 8
    tpotMs: 30
  gpu:
    product: NVIDIA-H200
"""


def _add(root: Path) -> None:
    (root / "models/llm/drafter.yaml").write_text(NEIGHBOUR)


def _remove(root: Path) -> None:
    (root / "models/llm/assistant-8b.yaml").unlink()


def _rebudget(root: Path) -> None:
    path = root / "models/research/big.yaml"
    assert "memoryBudget: 40Gi" in path.read_text()
    path.write_text(path.read_text().replace("memoryBudget: 40Gi", "memoryBudget: 64Gi", 1))


CASES = {"add-a-model": _add, "remove-a-model": _remove, "re-budget-a-model": _rebudget}


@pytest.fixture(scope="module", params=sorted(CASES))
def second(request, tmp_path_factory) -> tuple[str, PassOutput]:
    root = tmp_path_factory.mktemp(request.param) / "fleet"
    shutil.copytree(FLEET, root)
    apply(root)
    CASES[request.param](root)
    return request.param, apply(root)


def test_plan_md_and_the_commit_message_match_golden(second):
    case, out = second
    got = {"PLAN.md": out.rendered.files["rendered/PLAN.md"], "COMMIT_MSG": out.message}
    if os.environ.get("UPDATE_GOLDEN") == "1":
        for name, text in got.items():
            (GOLDEN / case).mkdir(parents=True, exist_ok=True)
            (GOLDEN / case / name).write_text(text, encoding="utf-8")
    for name, text in got.items():
        assert (GOLDEN / case / name).read_text(encoding="utf-8") == text, (
            f"tests/golden/effects/{case}/{name} differs (if intended: UPDATE_GOLDEN=1 pytest {Path(__file__).name})")


def test_every_neighbour_whose_prediction_moved_is_shown_before_and_after(second):
    case, out = second
    plan_md = out.rendered.files["rendered/PLAN.md"]
    neighbours = [c for c in out.rendered.changes if not c.moved]
    assert neighbours, f"{case}: the change touches no neighbour, so this case tests nothing"
    changes = plan_md.split("## Latest decision changes", 1)[1]
    body = review_summary(plan_md, "0" * 40, "main")
    for change in neighbours:
        line = change.summary
        assert re.fullmatch(r"\S+: (TTFT|TPOT|SLO).*", line) and " → " in line + " → "
        assert f"- {line}" in changes and f"- {line}" in body and line in out.message
        busy = {name: getattr(change.after.predicted, f"{name.lower()}_ms") for name in ("TTFT", "TPOT")}
        for name, value in busy.items():
            if f"{name} " in line:
                assert f"→ {value:.1f} ms (all busy)" in line
    summary = next(line for line in plan_md.splitlines() if line.startswith("**Plan:**"))
    assert f"· {len(out.rendered.changes)} models affected ·" in summary
    assert len(out.rendered.changes) > sum(1 for c in out.rendered.changes if c.moved)  # more than the edited


def test_a_new_model_that_misses_its_own_slo_says_so(second):
    case, out = second
    if case != "add-a-model":
        pytest.skip("only the added model is new")
    (added,) = [c for c in out.rendered.changes if c.before is None]
    assert added.after.slo_met is False and added.summary.endswith("; SLO missed (all busy)")
