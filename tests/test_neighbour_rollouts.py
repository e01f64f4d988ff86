"""A change to one model never restarts a worker that serves others: over examples/fleet served by a real git
daemon, `gpushare reconcile --offline` commits the fleet, a user pushes one change (a model added to the busy
H200, one that lands in elastic mode with pinned host memory, one removed, one re-budgeted), and the next pass
commits a tree in which no worker Deployment's pod template differs from the last one: only worker ConfigMaps
(and the Deployment's own annotations) change, and PLAN.md says `0 restart`."""
from __future__ import annotations

import pytest
import yaml

from contract.wire import HOST_MEMORY_ANNOTATION
from controller.cli.commands import main
from tests.conftest import REPO_ROOT
from tests.gitserver import git_server  # noqa: F401  (fixture)

FLEET = REPO_ROOT / "examples" / "fleet"
CHAT = "models/llm/chat.yaml"


def _model(name: str, model: str, budget: str, **slo) -> bytes:
    return yaml.safe_dump({"apiVersion": "gpushare.dev/v1alpha1", "kind": "ElasticModel",
                           "metadata": {"name": name, "namespace": "llm"},
                           "spec": {"model": model, "memoryBudget": budget, "gpu": {"product": "NVIDIA-H200"},
                                    "slo": {"contextTokens": 2048, "concurrency": 1, **slo}}}).encode()


def _rebudget(files: dict[str, bytes]) -> dict[str, bytes]:
    docs = list(yaml.safe_load_all(files[CHAT]))
    docs[0]["spec"]["memoryBudget"] = "5Gi"
    return {CHAT: yaml.safe_dump_all(docs).encode()}


CASES = {  # case id -> the user's push, from the fleet's files
    "a-small-model-added-to-the-busy-h200": lambda files: {
        "models/llm/tiny.yaml": _model("tiny", "Qwen/Qwen2.5-0.5B-Instruct", "2Gi")},
    "a-model-added-in-elastic-mode-changes-the-host-memory-need": lambda files: {
        "models/llm/squeezed.yaml": _model("squeezed", "Qwen/Qwen2.5-32B-Instruct", "12Gi")},
    "a-model-removed": lambda files: {"models/llm/assistant-8b.yaml": None},
    "a-model-re-budgeted": _rebudget,
}


def _reconcile(workdir, url) -> None:
    assert main(["reconcile", "--offline", "--repo", url, "--once", "--workdir", str(workdir)]) == 0


def _workers(files: dict[str, bytes]) -> tuple[dict[str, dict], dict[str, bytes]]:
    """(worker Deployment name -> its pod template, worker ConfigMap path -> its text) of a rendered tree."""
    templates, configs = {}, {}
    for path, data in files.items():
        if not path.startswith("rendered/"):
            continue
        if "/deployment-" in path:
            doc = yaml.safe_load(data)
            if doc["metadata"]["labels"].get("app.kubernetes.io/name") == "gpushare-worker":
                templates[doc["metadata"]["name"]] = doc["spec"]["template"]
        elif "/configmap-" in path and b"WorkerConfig" in data:
            configs[path] = data
    return templates, configs


@pytest.mark.integration
def test_one_models_change_rolls_no_worker_pod(git_server, tmp_path):  # noqa: F811
    """The cases run in turn on one repository (each a push on top of the last), each checked on its own."""
    files = {p.relative_to(FLEET).as_posix(): p.read_bytes() for p in FLEET.rglob("*") if p.is_file()}
    url = git_server.create_repo("fleet", files)
    _reconcile(tmp_path / "w", url)
    for case, push in CASES.items():
        before = git_server.files("fleet")
        git_server.push_files("fleet", push(before), f"user: {case}")
        _reconcile(tmp_path / "w", url)
        after = git_server.files("fleet")
        (old_templates, old_configs), (new_templates, new_configs) = _workers(before), _workers(after)
        shared = sorted(set(old_templates) & set(new_templates))
        assert shared, case
        rolled = [name for name in shared if old_templates[name] != new_templates[name]]
        assert not rolled, (case, rolled)
        assert any(old_configs.get(p) != new_configs.get(p) for p in set(old_configs) | set(new_configs)), case
        plan = after["rendered/PLAN.md"].decode()
        assert "0 restart" in plan and "restart:" not in plan, (case, [ln for ln in plan.splitlines()
                                                                      if "Workers" in ln])
        if "host-memory" in case:
            assert _host_memory(before) != _host_memory(after), case


def _host_memory(files: dict[str, bytes]) -> dict[str, str]:
    """worker Deployment name -> its gpushare.dev/host-memory annotation."""
    out = {}
    for path, data in files.items():
        if path.startswith("rendered/") and "/deployment-" in path:
            doc = yaml.safe_load(data)
            out[doc["metadata"]["name"]] = doc["metadata"].get("annotations", {}).get(HOST_MEMORY_ANNOTATION)
    return out
