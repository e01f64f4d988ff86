"""Cluster mode under stress: two replicas, API errors, a git remote that goes away; and the command's wiring."""
from __future__ import annotations

import kmock
import pytest
import yaml

from controller.cli.commands import main
from tests.cluster_loop_support import APP, EM, World, model_doc
from tests.gitserver import git_server  # noqa: F401  (the fixture)
from tests.kubedouble import kube  # noqa: F401  (the fixture)

pytestmark = pytest.mark.integration

NODES = kmock.resource("", "v1", "nodes")
ELASTICMODELS = kmock.resource("gpushare.dev", "v1alpha1", "elasticmodels")


@pytest.fixture
def world(kube, git_server, tmp_path) -> World:  # noqa: F811
    return World(kube, git_server, tmp_path)


def _status_patches(world: World) -> int:
    return sum(1 for r in world.kube.mock._requests if r.method == "PATCH" and r.url.path.endswith("/status"))


def test_two_replicas_one_writer_no_duplicate_commit(world):
    world.setup([model_doc(), model_doc(name="other", budget="6Gi")], estimated_profile=True)
    a, b = world.reconciler("pod-a"), world.reconciler("pod-b")
    initial = world.commits()

    reports = []
    for _ in range(3):
        reports += [("a", a.reconcile_once()), ("b", b.reconcile_once())]
        world.clock.now += 5

    assert [(who, r.leader) for who, r in reports] == [("a", True), ("b", False)] * 3
    assert all(r.published is None and r.status_writes == 0 for who, r in reports if who == "b")
    assert world.commits() == initial + 1
    assert _status_patches(world) == 2  # once per model, by pod-a
    lease = world.kube.get("coordination.k8s.io/v1", "leases", "gpushare-system", "gpushare-controller")
    assert lease["spec"]["holderIdentity"] == "pod-a"

    world.clock.now += 30  # pod-a stopped renewing: pod-b takes over and finds nothing to do
    takeover = b.reconcile_once()
    assert takeover.leader and takeover.ok and not takeover.published.changed and takeover.status_writes == 0
    assert a.reconcile_once().leader is False
    assert world.commits() == initial + 1


def test_faults_back_off_recover_and_lose_nothing(world):
    world.setup([model_doc()], estimated_profile=True)
    controller = world.reconciler()
    initial = world.commits()
    world.kube.fail(500, 1, "get", NODES)

    before_pass = {
        2: world.server.stop,
        4: lambda: (world.server.start(),
                    world.kube.fail(409, 2, "patch", ELASTICMODELS),  # retried inside the pass
                    world.kube.fail(500, 2, "patch", ELASTICMODELS)),  # fails this pass's and the next's write
    }
    one_pass, passes = controller.reconcile_once, []

    def scripted_pass():
        passes.append(len(passes) + 1)
        before_pass.get(passes[-1], lambda: None)()
        return one_pass()

    controller.reconcile_once = scripted_pass
    code = controller.run(10.0, passes=6)

    # pass 1: nodes 500 · 2, 3: git unreachable · 4: commit, status 409 409 500 · 5: status 500 · 6: written
    pass_waits = [w for w in world.waits if w >= 1.0]
    assert pass_waits == [1.0, 2.0, 4.0, 8.0, 16.0]
    assert [w for w in world.waits if w < 1.0] == [0.05, 0.1]  # the 409s, retried within the pass
    assert code == 0
    assert world.commits() == initial + 1
    decision = yaml.safe_load(world.files()["decisions/llm/chat.yaml"])
    assert decision["status"]["assigned"]["mode"] == "resident"
    assert world.conditions()["Assigned"]["status"] == "True"
    errors = controller.metrics.exposition().decode()
    assert 'gpushare_reconcile_errors_total{reason="ApiUnavailable"} 3.0' in errors
    assert 'gpushare_git_push_failures_total{reason="GitUnreachable"} 2.0' in errors
    assert "gpushare_git_commits_total 1.0" in errors


def test_a_replica_that_cannot_renew_stops_writing(world):
    world.setup([model_doc()], estimated_profile=True)
    controller = world.reconciler()
    controller.reconcile_once()
    before = world.commits()
    world.kube.fail(500, 10, "put", kmock.resource("coordination.k8s.io", "v1", "leases"))
    world.clock.now += 11  # past the renew deadline: the Lease may be someone else's soon
    report = controller.reconcile_once()
    assert not report.leader and report.published is None
    assert world.commits() == before


def _kubeconfig(tmp_path, url: str):
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "double",
        "clusters": [{"name": "double", "cluster": {"server": url}}],
        "users": [{"name": "test", "user": {}}],
        "contexts": [{"name": "double", "context": {"cluster": "double", "user": "test"}}]}))
    return path


def test_reconcile_kube_once_from_the_command_line(world, tmp_path, capsys):
    world.setup([model_doc()], estimated_profile=True)
    code = main(["reconcile", "--kube", "--once", "--repo", world.url, "--workdir", str(tmp_path / "work"),
                 "--kubeconfig", str(_kubeconfig(tmp_path, world.kube.url)), "--identity", "cli",
                 "--argocd-application", "/".join(APP)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "committed" in out and "status written on 1 ElasticModel(s)" in out
    assert "decisions/llm/chat.yaml" in world.files()
    assert world.kube.get(EM, "elasticmodels", "llm", "chat")["status"]["assigned"]["mode"] == "resident"
    lease = world.kube.get("coordination.k8s.io/v1", "leases", "gpushare-system", "gpushare-controller")
    assert lease["spec"].get("holderIdentity") is None  # released on exit


def test_a_malformed_application_flag_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["reconcile", "--kube", "--once", "--repo", "x", "--argocd-application", "gpushare-rendered"])
    assert exit_.value.code == 2
    assert "is not NAMESPACE/NAME" in capsys.readouterr().err
