"""Cluster mode end to end: the official client over HTTP against the API server double, a real git remote.

One ElasticModel goes from a push to Ready=True (profiler Job committed, its profile
committed under profiles/measured/, worker manifests committed, Argo CD synced, the
Deployment available, the worker's verdict applied); each Degraded path shows the
message a user acts on.
"""
from __future__ import annotations


import pytest
import yaml

from controller.cli.offline import pass_over
from tests.cluster_loop_support import NODE, PRODUCT, QWEN, REPO, SLOT, World, model_doc
from tests.gitserver import git, git_server  # noqa: F401  (the fixture)
from tests.kubedouble import kube  # noqa: F401  (the fixture)
from contract.verdicts import Verdict

pytestmark = pytest.mark.integration

MEASURED = f"profiles/measured/{PRODUCT}/qwen--qwen2.5-0.5b-instruct.yaml"


@pytest.fixture
def world(kube, git_server, tmp_path) -> World:  # noqa: F811
    return World(kube, git_server, tmp_path)


def _ready_parts(world: World) -> dict[str, tuple[str, str]]:
    return {kind: (c["status"], c["reason"]) for kind, c in world.conditions().items()}


def test_push_to_ready_through_profiling(world):
    world.setup([model_doc()])
    controller = world.reconciler()
    initial = world.commits()

    first = controller.reconcile_once()
    assert first.ok and first.published.changed
    jobs = world.rendered("Job")
    assert [j["metadata"]["annotations"]["gpushare.dev/model"] for j in jobs] == [QWEN]
    assert world.rendered("Deployment") == []
    assert _ready_parts(world)["Profiled"] == ("False", "Profiling")
    assert "profiler Job not started yet" in world.conditions()["Profiled"]["message"]

    world.publish_profile()
    second = controller.reconcile_once()
    assert second.ok and second.published.changed
    files = world.files()
    committed = yaml.safe_load(files[MEASURED])
    assert (committed["source"], committed["model"]) == ("measured", QWEN)
    assert MEASURED in second.published.message
    assert world.rendered("Job") == []  # profiled: the Job is pruned, the worker takes its place
    assert [d["spec"]["template"]["spec"]["nodeSelector"]["kubernetes.io/hostname"]
            for d in world.rendered("Deployment")] == [NODE]
    assigned = yaml.safe_load(files["decisions/llm/chat.yaml"])["status"]["assigned"]
    assert (assigned["mode"], assigned["profile"]) == ("resident", f"{QWEN}@{PRODUCT}")
    assert _ready_parts(world)["Synced"] == ("False", "SyncPending")

    world.worker_rolls_out()
    world.worker_reports(Verdict("chat", "llm", "resident", "applied", "Fits", "loaded", 1 << 30, 20 << 30, 0))
    world.argo_syncs(first.published.commit)  # an older revision, without the worker commit
    assert controller.reconcile_once().ok
    assert _ready_parts(world)["Ready"] == ("False", "SyncPending")
    newer = world.server.push_files(REPO, {"README.md": b"our fleet\n"}, "docs: readme")  # a user commit on top
    world.argo_syncs(newer)  # Argo CD reports the branch head, which descends from our commit
    third = controller.reconcile_once()

    assert third.ok and not third.published.changed and third.status_writes == 1
    status = world.status()
    conditions = world.conditions()
    assert {kind: c["status"] for kind, c in conditions.items()} == {
        "Profiled": "True", "Assigned": "True", "Synced": "True", "Ready": "True", "Degraded": "False",
        "SLOMet": "Unknown"}
    assert status["observedGeneration"] == 1
    assert {c["observedGeneration"] for c in conditions.values()} == {1}
    assert status["assigned"]["mode"] == "resident" and status["assigned"]["gpu"]["slot"] == SLOT
    assert f"commit {second.published.commit[:7]} synced by gpushare-rendered" in conditions["Ready"]["message"]
    assert world.commits() == initial + 3  # two by the controller, one by the user

    fourth = controller.reconcile_once()  # nothing new: no commit, no status write
    assert fourth.ok and not fourth.published.changed and fourth.status_writes == 0
    assert world.commits() == initial + 3


def test_a_broken_verdict_configmap_is_reported_without_failing_the_pass(world):
    world.setup([model_doc()], estimated_profile=True)
    controller = world.reconciler()
    assert controller.reconcile_once().published.changed
    world.worker_reports(data="models: [unclosed")
    report = controller.reconcile_once()
    assert report.ok
    assert [reason for reason, _ in report.warnings] == ["InvalidVerdicts"]
    assert 'gpushare_reconcile_errors_total{reason="InvalidVerdicts"} 1.0' in controller.metrics.exposition().decode()


def test_git_alone_replays_the_cluster_decision(world, tmp_path):
    world.setup([model_doc()])
    controller = world.reconciler()
    controller.reconcile_once()
    world.publish_profile()
    controller.reconcile_once()
    replay = tmp_path / "replay"
    git("clone", "-q", world.url, str(replay))
    (replay / "gpus.yaml").write_text(yaml.safe_dump({
        "apiVersion": "gpushare.dev/v1alpha1", "kind": "GPUInventory",
        "nodes": [{"name": NODE, "product": PRODUCT, "memory": "23034Mi", "count": 1}]}))
    offline = pass_over(replay)
    assert offline.files["decisions/llm/chat.yaml"] == (replay / "decisions/llm/chat.yaml").read_bytes()


def test_a_later_cr_generation_waits_for_git_and_status_never_claims_it(world):
    world.setup([model_doc()], estimated_profile=True)
    controller = world.reconciler()
    controller.reconcile_once()
    assert world.status()["observedGeneration"] == 1
    world.kube.seed("elasticmodels", {**model_doc(budget="8Gi"), "status": world.status()})  # not in git yet
    report = controller.reconcile_once()
    assert report.ok and report.waiting == ["llm/chat"]
    assert world.status()["observedGeneration"] == 1


def _refused_numbers(world: World) -> None:
    world.argo_syncs()
    world.worker_rolls_out()
    world.worker_reports(Verdict("chat", "llm", "resident", "refused", "InsufficientMemory", "measured free memory",
                                 need_bytes=3 << 30, available_bytes=2 << 30, missing_bytes=1 << 30))


def _sync_fails(world: World) -> None:
    world.argo_syncs(phase="Failed", message="one or more objects failed to apply, reason: "
                                             "admission webhook denied the Deployment")


DEGRADED = [
    ("worker-refused", {}, _refused_numbers, "WorkerRefused",
     "the worker on gpu-1/gpu0 refused resident: needs 3.0Gi, 2.0Gi available, 1.0Gi missing "
     "(InsufficientMemory: measured free memory)"),
    ("argo-sync-failed", {}, _sync_fails, "SyncFailed",
     "Argo CD Application gpushare-rendered failed to sync (Failed): one or more objects failed to apply, "
     "reason: admission webhook denied the Deployment"),
    ("invalid-spec", {"mode": "swap"}, None, "ModeNotAllowed",
     "models/llm/chat.yaml document 0 spec.mode: spec.mode is not a field: the operator assigns the mode"),
    ("budget-below-elastic-minimum", {"budget": "64Mi"}, None, "BudgetBelowElasticMinimum",
     "> limit 64.0Mi"),
]


@pytest.mark.parametrize("spec,after_first,reason,message", [c[1:] for c in DEGRADED], ids=[c[0] for c in DEGRADED])
def test_degraded_says_what_to_fix(world, spec, after_first, reason, message):
    world.setup([model_doc(**spec)], estimated_profile=True)
    controller = world.reconciler()
    controller.reconcile_once()
    if after_first is not None:
        after_first(world)
        controller.reconcile_once()
    conditions = world.conditions()
    assert (conditions["Degraded"]["status"], conditions["Degraded"]["reason"]) == ("True", reason)
    assert conditions["Ready"]["status"] == "False"
    assert message in conditions["Degraded"]["message"]
    assert world.status()["observedGeneration"] == 1


def test_budget_below_minimum_names_the_budget_that_would_do(world):
    world.setup([model_doc(budget="64Mi")], estimated_profile=True)
    report = world.reconciler().reconcile_once()
    decision = report.output.plan.decisions[0]
    assert decision.mode == "refused"
    assert world.conditions()["Degraded"]["message"] == decision.reason
    assert "Raise memoryBudget to at least 667.7Mi," in decision.reason  # the elastic minimum, rounded up


def test_failed_profiler_job_shows_its_termination_message(world):
    world.setup([model_doc()])
    controller = world.reconciler()
    controller.reconcile_once()
    job = world.profiler_fails("gated model: accept the licence of Qwen/Qwen2.5-0.5B-Instruct on the hub")
    controller.reconcile_once()
    conditions = world.conditions()
    assert (conditions["Degraded"]["status"], conditions["Degraded"]["reason"]) == ("True", "ProfileFailed")
    assert conditions["Profiled"]["message"] == (
        f"profiler Job {job} failed: gated model: accept the licence of Qwen/Qwen2.5-0.5B-Instruct on the hub")


def test_a_cluster_object_missing_from_git_is_told_to_commit_it(world):
    world.setup([model_doc()], estimated_profile=True)
    world.kube.seed("elasticmodels", model_doc(name="stray"))
    world.reconciler().reconcile_once()
    degraded = world.conditions("stray")["Degraded"]
    assert (degraded["status"], degraded["reason"]) == ("True", "NotInGit")
    assert "commit it under models/" in degraded["message"]
    assert "stray" not in str(world.files().keys())
