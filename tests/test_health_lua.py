"""The Argo CD health check for ElasticModel, run in a real Lua 5.1 (Argo CD's gopher-lua dialect) via lupa."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import lupa.lua51 as lua51
import pytest
import yaml

from controller.observe.status import JobState, Observed, WorkerVerdict, WorkloadState, conditions_for, status_patch
from tests.test_status import ALL_GOOD, BELOW_MINIMUM, MODEL, PENDING, RESIDENT, SYNCED_APP

ROOT = Path(__file__).resolve().parent.parent
HEALTH_DIR = ROOT / "config" / "argocd" / "health" / "gpushare.dev_ElasticModel"
SCRIPT = (HEALTH_DIR / "health.lua").read_text()
CASES = yaml.safe_load((HEALTH_DIR / "health_test.yaml").read_text())["tests"]


def run_health(obj: dict) -> tuple[str, str]:
    """Argo CD's contract: the script sees the object as the global `obj` and returns {status, message}."""
    lua = lua51.LuaRuntime()
    lua.globals().obj = lua.table_from(obj, recursive=True)
    result = lua.execute(SCRIPT)
    return result["status"], result["message"]


@pytest.mark.parametrize("case", CASES, ids=[Path(c["inputPath"]).stem for c in CASES])
def test_every_sample_in_health_test_yaml(case):
    obj = yaml.safe_load((HEALTH_DIR / case["inputPath"]).read_text())
    assert run_health(obj) == (case["healthStatus"]["status"], case["healthStatus"]["message"])


def test_the_samples_cover_every_outcome_and_the_issue_cases():
    names = {Path(c["inputPath"]).stem for c in CASES}
    assert {c["healthStatus"]["status"] for c in CASES} == {"Healthy", "Progressing", "Degraded"}
    assert {"healthy", "progressing-stale-generation", "progressing-no-status"} <= names
    assert all((HEALTH_DIR / c["inputPath"]).is_file() for c in CASES)


def test_the_argocd_cm_copy_is_the_same_script():
    patch = yaml.safe_load((ROOT / "config" / "argocd" / "argocd-cm-patch.yaml").read_text())
    assert patch["metadata"]["name"] == "argocd-cm"
    assert patch["data"]["resource.customizations.health.gpushare.dev_ElasticModel"] == SCRIPT


def _live(generation: int, decision, pending, observed) -> dict:
    """An ElasticModel with the status the controller writes today (merge-patch nulls dropped)."""
    model = dataclasses.replace(MODEL, generation=generation)
    conditions = conditions_for(model, decision, pending, None, observed, [], "2026-01-01T00:00:00Z")
    status = {k: v for k, v in status_patch(model, conditions, decision)["status"].items() if v is not None}
    return {"metadata": {"name": "chat", "namespace": "llm", "generation": generation}, "status": status}


LIVE_CASES = [
    ("ready", RESIDENT, None, ALL_GOOD, "Healthy", "resident on node-a/gpu0"),
    ("awaiting-worker", RESIDENT, None, dataclasses.replace(ALL_GOOD, verdict=None), "Progressing", "AwaitingWorker:"),
    ("worker-refused", RESIDENT, None, dataclasses.replace(ALL_GOOD, verdict=WorkerVerdict(
        "resident", "refused", "node-a/gpu0", "InsufficientMemory", "", 3 << 30, 2 << 30, 1 << 30)),
     "Degraded", "1.0Gi missing"),
    ("profile-failed", None, PENDING, Observed(job=JobState("profile-chat", "Failed", "no GPU on this node")),
     "Degraded", "ProfileFailed: profiler Job profile-chat failed: no GPU on this node"),
    ("budget-below-minimum", BELOW_MINIMUM, None, ALL_GOOD, "Degraded", "BudgetBelowElasticMinimum:"),
    ("sync-failed", RESIDENT, None, dataclasses.replace(ALL_GOOD, app=dataclasses.replace(
        SYNCED_APP, operation_phase="Error", operation_message="rpc error")), "Degraded", "SyncFailed:"),
    ("pool-node-not-there-yet", dataclasses.replace(RESIDENT, slot="pool-l4-0/gpu0", pool="l4"), None,
     dataclasses.replace(ALL_GOOD, verdict=None, workload=WorkloadState(
         "worker-pool-l4-0-gpu0-default", False, "0/1 replicas available, 0/1 updated")),
     "Progressing", "AwaitingNode: worker-pool-l4-0-gpu0-default on pool-l4-0/gpu0 waits for a node of pool l4"),
]


@pytest.mark.parametrize("decision,pending,observed,health,words", [c[1:] for c in LIVE_CASES],
                         ids=[c[0] for c in LIVE_CASES])
def test_the_script_reads_what_controller_status_writes(decision, pending, observed, health, words):
    status, message = run_health(_live(3, decision, pending, observed))
    assert status == health
    assert words in message


def test_a_ready_status_for_an_older_generation_is_progressing():
    obj = _live(3, RESIDENT, None, ALL_GOOD)
    obj["metadata"]["generation"] = 4  # the user edited the spec; the controller has not caught up
    assert run_health(obj) == (
        "Progressing", "Waiting for the gpushare controller to observe generation 4 (status describes 3)")
