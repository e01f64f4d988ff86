"""The fault test in cluster mode: the same reader, so a broken profile or composition in git keeps every
rendered object, the error is in the pass's report, and a fix restores normal passes.

One ElasticModel served from the shipped estimate on an L4 (the API server double, a real git remote);
then its profile and a repository composition are broken in turn."""
from __future__ import annotations

import pytest

from tests.cluster_loop_support import PRODUCT, REPO, World, model_doc
from tests.gitserver import git_server  # noqa: F401  (the fixture)
from tests.kubedouble import kube  # noqa: F401  (the fixture)

pytestmark = pytest.mark.integration

PROFILE = f"profiles/{PRODUCT}/qwen--qwen2.5-0.5b-instruct.yaml"
COMPOSITION = "compositions/default.yaml"
REPO_COMPOSITION = b"""apiVersion: gpushare.dev/v1alpha1
kind: Composition
metadata: {name: default}
spec:
  parameters: {image: registry.example.com/gpushare/worker:1.2.3}
  steps:
    profiling: {perModel: [profiler-rbac.yaml.j2, profiler-job.yaml.j2]}
    serving:
      perWorker: [worker-rbac.yaml.j2, worker-configmap.yaml.j2, worker-deployment.yaml.j2]
      perModel: [model-service.yaml.j2]
"""


@pytest.fixture
def world(kube, git_server, tmp_path) -> World:  # noqa: F811
    return World(kube, git_server, tmp_path)


def rendered(world: World) -> dict[str, bytes]:
    return {p: d for p, d in world.files().items() if p.startswith("rendered/") and p != "rendered/PLAN.md"}


@pytest.mark.parametrize("path, broken", [
    pytest.param(PROFILE, b"weights: [", id="profile-syntax-error"),
    pytest.param(PROFILE, b"? [a]\n: b\n", id="profile-sequence-key"),
    pytest.param(COMPOSITION, REPO_COMPOSITION.replace(b"image:", b"imagee:"), id="composition-unknown-field"),
])
def test_a_broken_input_in_git_keeps_the_fleet_in_cluster_mode(world, path, broken):
    world.setup([model_doc()], estimated_profile=True)
    world.server.push_files(REPO, {COMPOSITION: REPO_COMPOSITION}, "the fleet's own default composition")
    controller = world.reconciler()
    first = controller.reconcile_once()
    assert first.ok and not first.output.errors
    before = rendered(world)
    assert [d["kind"] for d in world.rendered("Deployment")] == ["Deployment"]
    good = world.files()[path]

    world.server.push_files(REPO, {path: broken}, f"break {path}")
    report = controller.reconcile_once()

    assert rendered(world) == before
    assert path in {e.file for e in report.output.inputs.errors} and report.output.held == (path,)

    world.server.push_files(REPO, {path: good}, f"fix {path}")
    fixed = controller.reconcile_once()
    assert fixed.ok and not fixed.output.errors and fixed.output.held == ()
    assert rendered(world) == before


def test_the_prune_guard_holds_a_pass_when_the_gpu_nodes_vanish(world):
    world.setup([model_doc()], estimated_profile=True)
    controller = world.reconciler(max_prune_share=0.5)
    assert controller.reconcile_once().ok
    before, head = rendered(world), world.head()
    world.kube.seed("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-1"}})  # labels gone

    report = controller.reconcile_once()

    assert world.head() == head and rendered(world) == before
    assert [reason for reason, _ in report.warnings] == ["PruneHeld"]
    assert "--max-prune-share 1" in report.warnings[0][1]
