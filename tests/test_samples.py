"""The shipped samples land where their comments say: examples/fleet and config/samples/four-models.yaml."""
from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from controller.inputs.reader import load_repo
from controller.planning.plan import plan
from tests.conftest import REPO_ROOT

FLEET = REPO_ROOT / "examples" / "fleet"


def modes(root: Path) -> dict[str, str]:
    inputs = load_repo(root)
    assert inputs.errors == ()
    result = plan(inputs)
    got = {d.name: d.mode for d in result.decisions}
    got.update({p.name: "pending" for p in result.pending})
    return got


def test_fleet_lands_in_all_three_modes_a_refusal_and_a_pending_profile():
    assert modes(FLEET) == {
        "chat-small": "resident", "assistant-8b": "resident", "summarizer": "resident",
        "coder-32b": "swap", "reviewer-32b": "swap",
        "analyst-70b": "elastic",
        "tiny-70b": "refused",
        "mistral-7b": "pending",
    }


def test_four_models_on_one_h200_get_resident_swap_and_elastic(tmp_path):
    (tmp_path / "models").mkdir()
    shutil.copy(REPO_ROOT / "config" / "samples" / "four-models.yaml", tmp_path / "models")
    shutil.copytree(FLEET / "profiles", tmp_path / "profiles")
    (tmp_path / "gpus.yaml").write_text(
        "apiVersion: gpushare.dev/v1alpha1\nkind: GPUInventory\n"
        "nodes: [{name: h200-node, product: NVIDIA-H200, memory: 143771Mi}]\n"
    )
    docs = list(yaml.safe_load_all((tmp_path / "models" / "four-models.yaml").read_text()))
    assert all(set(d["spec"]) == {"model", "memoryBudget", "slo", "gpu"} for d in docs)  # no mode anywhere
    assert modes(tmp_path) == {"chat-small": "resident", "coder-32b": "swap", "reviewer-32b": "swap",
                               "analyst-70b": "elastic"}
