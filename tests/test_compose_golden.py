"""Generated trees checked in under tests/golden/ as a reviewer would approve them:
tests/golden/fleet is one reconcile pass over examples/fleet (tests/golden/fleet-t4 over examples/fleet-t4: an
int8 model on a Tesla-T4); tests/golden/scenario is compose on a fixed plan with previous decisions (so PLAN.md
shows changes).

Regenerate after an intended change, then review the diff:
    UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/test_compose_golden.py -q
"""
from __future__ import annotations

import difflib
from dataclasses import replace
import os
import random
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

import schemas

from controller.rendering.compose import compose
from controller.inputs.reader import read_repo
from controller.passes.reconcile import run_pass
from controller.rendering.names import service_name
from controller.types import Plan
from tests.compose_scenario import LAST, MODELS, PLAN, PREVIOUS, SLOTS, last_pass
from tests.conftest import REPO_ROOT

GOLDEN = Path(__file__).resolve().parent / "golden"


@pytest.fixture(scope="module")
def rendered():
    return compose(MODELS, PLAN, SLOTS, LAST)


def _fleet_files(name: str = "fleet") -> dict[str, str]:
    fleet = REPO_ROOT / "examples" / name
    # a first reconcile: no rendered tree yet (so every worker is new, every profiler Job created)
    tree = read_repo(fleet)
    return run_pass(replace(tree, last=replace(tree.last, workers={}, paths=()))).rendered.files


def _read_tree(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): p.read_text(encoding="utf-8") for p in sorted(root.rglob("*")) if p.is_file()}


def _write_tree(root: Path, files: dict[str, str]) -> None:
    for stale in set(_read_tree(root)) - set(files):
        (root / stale).unlink()
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text, encoding="utf-8")


@pytest.mark.parametrize("tree", ["scenario", "fleet", "fleet-t4"])
def test_tree_matches_golden(tree, rendered):
    files = rendered.files if tree == "scenario" else _fleet_files(tree)
    golden = GOLDEN / tree
    if os.environ.get("UPDATE_GOLDEN") == "1":
        _write_tree(golden, files)
    expected = _read_tree(golden)
    missing, extra = sorted(set(expected) - set(files)), sorted(set(files) - set(expected))
    changed = [
        "".join(difflib.unified_diff(expected[p].splitlines(True), files[p].splitlines(True),
                                     f"expected: tests/golden/{tree}/{p}", f"got: {p}"))
        for p in sorted(set(expected) & set(files)) if expected[p] != files[p]
    ]
    assert not (missing or extra or changed), (
        f"rendered tree differs from tests/golden (if intended: UPDATE_GOLDEN=1 pytest {Path(__file__).name})\n"
        f"missing: {missing}\nextra: {extra}\n" + "\n".join(changed)
    )


def test_scenario_renders_without_errors(rendered):
    assert rendered.errors == ()


def test_every_rendered_object_passes_kubernetes_validate(rendered):
    manifests = {p: t for p, t in rendered.files.items() if p.startswith("rendered/") and p.endswith(".yaml")}
    assert len(manifests) >= 20
    for path, text in manifests.items():
        docs = list(yaml.safe_load_all(text))
        assert len(docs) == 1, f"{path}: one object per file"
        if docs[0]["kind"] == "PodMonitor":  # a Prometheus Operator custom resource: its own schema
            schemas.validator("podmonitor").validate(docs[0])
            continue
        kubernetes_validate.validate(docs[0], "1.30", strict=True)


def test_same_input_twice_is_byte_identical(rendered):
    assert compose(MODELS, PLAN, SLOTS, LAST).files == rendered.files


def test_shuffled_input_is_byte_identical(rendered):
    rng = random.Random(7)
    shuffled = lambda items: rng.sample(list(items), len(items))  # noqa: E731
    plan = Plan(decisions=tuple(shuffled(PLAN.decisions)), pending=tuple(shuffled(PLAN.pending)))
    previous = dict(shuffled(PREVIOUS.items()))
    again = compose(shuffled(MODELS), plan, shuffled(SLOTS), last_pass(previous))
    assert again.files == rendered.files
    assert list(again.files) == sorted(again.files)


def test_owners_name_the_models_behind_each_file(rendered):
    assert rendered.owners[f"rendered/gpushare-system/service-{service_name('llm', 'coder')}.yaml"] == ("llm/coder",)
    assert rendered.owners["rendered/gpushare-system/deployment-worker-node-a-gpu0-default.yaml"] == (
        "llm/chat-small", "llm/coder", "llm/summarizer")
    assert rendered.owners["decisions/llm/huge.yaml"] == ("llm/huge",)


def test_the_typed_index_names_exactly_the_objects_the_files_hold():
    """Later stages read `Rendered.objects` and `verdict_sources` instead of parsing the YAML compose wrote."""
    fleet = REPO_ROOT / "examples" / "fleet"
    rendered = run_pass(read_repo(fleet)).rendered
    parsed, sources = {}, set()
    for path, text in rendered.files.items():
        if path.startswith("rendered/") and path.endswith(".yaml"):
            doc = yaml.safe_load(text)
            parsed[path] = (doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"])  # Namespace: ""
            if doc["kind"] == "ConfigMap" and "worker.yaml" in doc.get("data", {}):
                where = yaml.safe_load(doc["data"]["worker.yaml"])["verdicts"]["configMap"]
                sources.add((where["namespace"], where["name"]))
    assert {p: (o.kind, o.namespace, o.name) for p, o in rendered.objects.items()} == parsed
    assert rendered.verdict_sources == frozenset(sources) and sources
