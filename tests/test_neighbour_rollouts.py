"""A change to one model never restarts a worker that serves others: a pass over a copy of examples/fleet writes
its tree back as a commit would, the user changes one model (one added to the busy H200, one that lands in
elastic mode with pinned host memory, one removed, one re-budgeted), and the next pass writes a tree in which
no worker Deployment's pod template differs from the last one: only worker ConfigMaps (and the Deployment's own
annotations) change, and PLAN.md says `0 restart`."""
from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from contract.wire import HOST_MEMORY_ANNOTATION
from controller.cli.offline import pass_over
from tests.conftest import REPO_ROOT

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


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _push(root: Path, change: dict[str, bytes | None]) -> None:
    for path, data in change.items():
        if data is None:
            (root / path).unlink()
        else:
            (root / path).write_bytes(data)


def _reconcile(root: Path) -> None:
    """One pass over `root`, its generated tree written back as its commit would leave it."""
    out = pass_over(root)
    shutil.rmtree(root / "rendered", ignore_errors=True)
    for path, text in out.rendered.files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)


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


def test_one_models_change_rolls_no_worker_pod(tmp_path):
    """The cases run in turn on one repository (each a change on top of the last), each checked on its own."""
    root = tmp_path / "repo"
    shutil.copytree(FLEET, root)
    _reconcile(root)
    for case, change in CASES.items():
        before = _files(root)
        _push(root, change(before))
        _reconcile(root)
        after = _files(root)
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
