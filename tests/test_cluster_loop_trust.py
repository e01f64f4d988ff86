"""Cluster mode trusts only what it asked for: forged profile and verdict ConfigMaps, a stale verdict from
the model's previous slot, and a replica deposed while it rendered (it must not push)."""
from __future__ import annotations

import pytest

import controller.cli.cluster_loop as cluster_loop
from tests.cluster_loop_support import PRODUCT, World, model_doc
from tests.gitserver import git_server  # noqa: F401  (the fixture)
from tests.kubedouble import kube  # noqa: F401  (the fixture)
from contract.verdicts import Verdict

pytestmark = pytest.mark.integration

MEASURED = f"profiles/measured/{PRODUCT}/qwen--qwen2.5-0.5b-instruct.yaml"
APPLIED = Verdict("chat", "llm", "resident", "applied", "Fits", "loaded", 1 << 30, 20 << 30, 0)


@pytest.fixture
def world(kube, git_server, tmp_path) -> World:  # noqa: F811
    return World(kube, git_server, tmp_path)


def test_a_forged_profile_in_another_namespace_is_ignored_and_the_requested_one_used(world):
    world.setup([model_doc()])
    controller = world.reconciler()
    controller.reconcile_once()  # no profile: the profiler Job is committed
    world.publish_profile(namespace="attacker")  # right name and label, wrong namespace

    forged = controller.reconcile_once()
    assert forged.ok and MEASURED not in world.files()
    assert [reason for reason, _ in forged.warnings] == ["ProfileNotRequested"]
    assert "ConfigMap/attacker/" in forged.warnings[0][1]
    assert world.conditions()["Profiled"]["reason"] == "Profiling"
    assert 'gpushare_reconcile_errors_total{reason="ProfileNotRequested"} 1.0' in \
        controller.metrics.exposition().decode()

    world.publish_profile()  # the profiler Job's own ConfigMap, in the model's namespace
    used = controller.reconcile_once()
    assert used.ok and used.published.changed and MEASURED in world.files()
    assert "(from ConfigMap/llm/" in used.published.message
    assert world.conditions()["Profiled"]["status"] == "True"


def _deployed(world: World):
    world.setup([model_doc()], estimated_profile=True)
    controller = world.reconciler()
    controller.reconcile_once()
    world.argo_syncs()
    world.worker_rolls_out()
    return controller


def _ready(world: World) -> tuple[str, str, str]:
    ready = world.conditions()["Ready"]
    return ready["status"], ready["reason"], ready["message"]


def test_a_verdict_from_outside_the_worker_namespace_is_ignored(world):
    controller = _deployed(world)
    world.worker_reports(APPLIED, namespace="llm")  # the worker's ConfigMap name, in the user's namespace
    assert controller.reconcile_once().ok
    status, reason, message = _ready(world)
    assert (status, reason) == ("False", "AwaitingWorker") and "no verdict yet" in message

    world.worker_reports(APPLIED)
    assert controller.reconcile_once().ok
    assert _ready(world)[:2] == ("True", "Ready")


def test_a_stale_verdict_from_the_previous_slot_does_not_make_the_model_ready(world):
    controller = _deployed(world)
    world.worker_reports(APPLIED, slot="gpu-0/gpu0")  # what the worker said where the model ran before
    assert controller.reconcile_once().ok
    status, reason, message = _ready(world)
    assert (status, reason) == ("False", "AwaitingWorker") and "no verdict yet" in message


def test_a_leader_deposed_while_it_rendered_does_not_push(world, monkeypatch):
    world.setup([model_doc()], estimated_profile=True)
    leader, standby = world.reconciler("pod-a"), world.reconciler("pod-b")
    before = world.commits()
    render = cluster_loop.render_in_cluster

    def slow_render(tree, facts, *args):
        rendered = render(tree, facts, *args)
        assert not standby.election.try_acquire_or_renew()  # pod-b sees pod-a's fresh Lease
        world.clock.now += 20  # the render outlasts the Lease (15 s): pod-a's hold expires
        assert standby.election.try_acquire_or_renew()  # and pod-b takes over
        return rendered

    monkeypatch.setattr(cluster_loop, "render_in_cluster", slow_render)
    report = leader.reconcile_once()

    assert [reason for reason, _ in report.errors] == ["LeadershipLost"]
    assert report.published is None and report.status_writes == 0
    assert world.commits() == before
    assert world.status() == {}
