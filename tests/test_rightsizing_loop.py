"""Right-sizing run by the installed controller, not by a command: the reconcile loops (offline and cluster) run a
right-sizing pass when it is due, against a Prometheus double over HTTP and a real git remote (git daemon).

- `reconcile --offline --once --prometheus URL` commits the records and the Recommend proposal, and the reconcile
  pass right after plans with them (Auto's effective budget, PLAN.md's open recommendations);
- in cluster mode only the Lease holder reads Prometheus; the ElasticModel's status.conditions carry the loop's
  conditions; the next pass inside the interval reads nothing; Prometheus going down holds every budget, says so
  (UsageAvailable=False, one warning per outage, the held count) and the reconcile loop goes on;
- a right-sizing pass that crashes, or whose leader lost the Lease, commits nothing, is counted and backed off, and
  the reconcile pass still runs.
"""
from __future__ import annotations

import logging
import threading

import pytest
import yaml

from controller.cli.commands import main
from controller.cli.metrics import ControllerMetrics
from controller.cli.rightsizing_loop import RightsizingSchedule
from controller.rightsizing.prometheus import read_usage
from controller.inputs.rightsizing_records import RECORDS_BRANCH
from gitops import WorkingCopy
from tests.cluster_loop_support import World, model_doc
from tests.gitserver import git_server  # noqa: F401  (fixture)
from tests.kubedouble import kube  # noqa: F401  (fixture)
from tests.promdouble import PrometheusDouble
from tests.test_rightsizing_pass import _fleet, git_server_log

pytestmark = pytest.mark.integration

GiB, MiB = 1 << 30, 1 << 20
STEP = 60
HOUR = 3600


def _usage(device_bytes: int) -> dict:
    return {"deviceBytes": device_bytes, "kvUsedBytes": device_bytes // 20, "kvReservedBytes": device_bytes // 4}


def _metric(metrics: ControllerMetrics, name: str, **labels) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_offline_reconcile_runs_right_sizing_first_and_its_pass_plans_with_the_records(git_server, tmp_path):  # noqa: F811
    url = git_server.create_repo("fleet", _fleet(tmp_path))
    with PrometheusDouble({"llm/chat-small": _usage(GiB), "llm/summarizer": _usage(GiB + GiB // 2)}, STEP) as prom:
        code = main(["reconcile", "--offline", "--repo", url, "--once", "--workdir", str(tmp_path / "r"),
                     "--prometheus", prom.url, "--rightsize-window", "3h", "--rightsize-step", "60s"])
    assert code == 0
    assert prom.asked and {a["step"] for a in prom.asked} == {"60", "1800"}  # the scrape grid, the history peaks
    files = git_server.files("fleet")
    chat = yaml.safe_load(files["decisions/rightsizing/llm/chat-small.yaml"])
    assert chat["policy"] == "Recommend" and chat["budgetBytes"] < chat["specBudgetBytes"] == 4 * GiB
    kv = chat["kvReservation"]  # sized by the fleet's profile: never below one full-context sequence
    assert kv["sequences"] >= 1 and kv["recommendedBytes"] >= kv["floorBytes"] > 0
    edited = git_server.files("fleet", branch="gpushare/rightsize-llm-chat-small")["models/llm/chat.yaml"].decode()
    assert f"memoryBudget: {chat['budgetBytes'] >> 20}Mi" in edited
    message = git_server_log(git_server, "gpushare/rightsize-llm-chat-small")
    assert "KV reservation: " in message and f"slo.concurrency {kv['sequences']}" in message
    # the reconcile pass of the same run planned with the records: Auto's budget, PLAN.md's open recommendations
    assert yaml.safe_load(files["decisions/llm/summarizer.yaml"])["status"]["assigned"]["budgetBytes"] == 2 * GiB
    plan = files["rendered/PLAN.md"].decode()
    assert "## Open right-sizing recommendations" in plan and "review `gpushare/rightsize-llm-chat-small`" in plan


def test_offline_polling_runs_right_sizing_on_its_own_cadence_and_logs_it(git_server, tmp_path, monkeypatch,
                                                                          capsys):  # noqa: F811
    url = git_server.create_repo("fleet", _fleet(tmp_path))
    asked_per_pass = []
    with PrometheusDouble({"llm/chat-small": _usage(GiB)}, STEP) as prom:
        def three_passes(attempt, interval, **kwargs) -> int:
            for _ in range(3):
                assert attempt().ok
                asked_per_pass.append(len(prom.asked))
            return 0

        monkeypatch.setattr("controller.cli.reconcile_cmd.run_loop", three_passes)
        code = main(["--log-format", "json", "reconcile", "--offline", "--repo", url, "--interval", "30s",
                     "--workdir", str(tmp_path / "r"), "--prometheus", prom.url, "--rightsize-window", "3h",
                     "--rightsize-step", "60s"])
    assert code == 0
    assert asked_per_pass[0] > 0 and asked_per_pass == [asked_per_pass[0]] * 3  # due once in 5 minutes
    messages = [yaml.safe_load(line)["message"] for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
    assert any(m.startswith("right-sizing on: a pass every 300 s") for m in messages)
    assert any(m.startswith("right-sizing committed ") and "gpushare/rightsize-llm-chat-small" in m for m in messages)
    assert "decisions/rightsizing/llm/chat-small.yaml" in git_server.files("fleet")


def test_a_bad_prometheus_url_is_refused_before_touching_git(tmp_path, capsys):
    code = main(["reconcile", "--offline", "--repo", str(tmp_path / "nowhere"), "--once", "--prometheus", "prom:9090"])
    assert code == 2 and "[PrometheusUrlInvalid]" in capsys.readouterr().err


RIGHTSIZING = {"policy": "Recommend", "downsizeAfter": "1h", "cooldown": "1h"}


@pytest.fixture
def world(kube, git_server, tmp_path) -> World:  # noqa: F811
    world = World(kube, git_server, tmp_path)
    world.setup([model_doc(rightsizing=RIGHTSIZING)], estimated_profile=True)
    return world


def _schedule(world: World, url: str, metrics: ControllerMetrics) -> RightsizingSchedule:
    return RightsizingSchedule(lambda start, end, fleet: read_usage(url, start, end, STEP, fleet=fleet), interval_s=300,
                               window_s=3 * HOUR, metrics=metrics, clock=world.clock, jitter=lambda low, high: high)


def test_the_leader_commits_right_sizing_then_holds_and_says_so_when_prometheus_stops(world, caplog):
    prom = PrometheusDouble({"llm/chat": _usage(GiB)}, STEP)
    try:
        metrics_a, metrics_b = ControllerMetrics(), ControllerMetrics()
        leader = world.reconciler("pod-a", metrics=metrics_a, rightsizing=_schedule(world, prom.url, metrics_a))
        standby_schedule = _schedule(world, prom.url, metrics_b)
        standby = world.reconciler("pod-b", metrics=metrics_b, rightsizing=standby_schedule)

        first = leader.reconcile_once()
        assert first.ok and first.leader
        asked = len(prom.asked)
        assert asked and not standby.reconcile_once().leader
        assert len(prom.asked) == asked and standby_schedule.next_at is None  # a standby never reads nor writes

        files = world.files()
        record = yaml.safe_load(files["decisions/rightsizing/llm/chat.yaml"])
        assert record["budgetBytes"] < 4 * GiB and record["reviewBranch"] == "gpushare/rightsize-llm-chat"
        assert world.server.head("fleet.git", "gpushare/rightsize-llm-chat") is not None
        assert "## Open right-sizing recommendations" in files["rendered/PLAN.md"].decode()
        conditions = world.conditions()
        assert {t: (conditions[t]["status"], conditions[t]["reason"]) for t in
                ("UsageAvailable", "NeedsCapacity", "AtMaxBudget")} == {
            "UsageAvailable": ("True", "UsageRead"), "NeedsCapacity": ("False", "CapacityAvailable"),
            "AtMaxBudget": ("False", "BelowMaxBudget")}
        assert conditions["UsageAvailable"]["observedGeneration"] == 1
        rightsizing = world.status()["rightsizing"]
        assert rightsizing["recommendation"]["budgetBytes"] == record["budgetBytes"]
        assert rightsizing["specBudgetBytes"] == rightsizing["effectiveBudgetBytes"] == 4 * GiB  # Recommend waits
        assert _metric(metrics_a, "gpushare_rightsizing_passes_total", result="ok") == 1
        assert _metric(metrics_a, "gpushare_rightsizing_last_success_timestamp_seconds") == world.clock()

        commits = world.commits()
        world.clock.now += 60  # inside the interval: the reconcile pass runs, right-sizing does not
        assert leader.reconcile_once().ok and len(prom.asked) == asked
        world.clock.now += 300  # due again: same usage, nothing new to commit
        assert leader.reconcile_once().ok and len(prom.asked) > asked and world.commits() == commits

        prom.stop()  # Prometheus goes down mid-window
        with caplog.at_level(logging.WARNING, logger="gpushare.rightsizing"):
            for _ in range(2):
                world.clock.now += 330
                assert leader.reconcile_once().ok  # the reconcile loop goes on
                # the same pass planned on the hold it committed: the status says so at once
                assert world.conditions()["UsageAvailable"]["status"] == "False"
        assert caplog.text.count("right-sizing holds: usage unavailable") == 1  # once per outage
        held = yaml.safe_load(world.files()["decisions/rightsizing/llm/chat.yaml"])
        assert held["budgetBytes"] == record["budgetBytes"]  # no change on missing data
        assert held["conditions"][0]["reason"] == "UsageMissing"
        conditions = world.conditions()
        assert (conditions["UsageAvailable"]["status"], conditions["UsageAvailable"]["reason"]) == (
            "False", "UsageMissing")
        assert conditions["NeedsCapacity"]["status"] == "Unknown"
        assert conditions["Ready"]["reason"] != "UsageMissing"  # advisory: Ready does not depend on it
        assert _metric(metrics_a, "gpushare_rightsizing_passes_total", result="held") == 2
        assert _metric(metrics_a, "gpushare_rightsizing_failures_total", reason="UsageUnavailable") == 2
        assert b"gpushare_rightsizing_last_success_timestamp_seconds" in metrics_a.exposition()
    finally:
        prom.stop()


def test_under_a_review_write_back_the_status_shows_the_records_awaiting_review_and_a_hold(world):
    """The records go to their own review branch, not to main; the status still says what the loop saw."""
    prom = PrometheusDouble({"llm/chat": _usage(GiB)}, STEP)
    try:
        metrics = ControllerMetrics()
        schedule = RightsizingSchedule(lambda start, end, fleet: read_usage(prom.url, start, end, STEP, fleet=fleet), interval_s=300,
                                       window_s=3 * HOUR, metrics=metrics, clock=world.clock,
                                       jitter=lambda low, high: high, records_target=f"branch:{RECORDS_BRANCH}")
        leader = world.reconciler("pod-a", metrics=metrics, rightsizing=schedule, target="branch:gpushare/plan")
        assert leader.reconcile_once().ok
        assert not any(path.startswith("decisions/rightsizing/") for path in world.files())  # main: unreviewed none
        pending = world.server.files("fleet.git", branch=RECORDS_BRANCH)
        assert yaml.safe_load(pending["decisions/rightsizing/llm/chat.yaml"])["budgetBytes"] < 4 * GiB
        usage = world.conditions()["UsageAvailable"]
        assert (usage["status"], usage["reason"]) == ("True", "UsageRead")
        assert world.status()["rightsizing"]["recommendation"]["budgetBytes"] < 4 * GiB

        prom.stop()
        world.clock.now += 330
        assert leader.reconcile_once().ok
        usage = world.conditions()["UsageAvailable"]
        assert (usage["status"], usage["reason"]) == ("False", "UsageMissing")  # the hold, before any merge
    finally:
        prom.stop()


def test_a_crashing_right_sizing_pass_is_backed_off_and_the_reconcile_pass_still_runs(world, caplog):
    def crash(start, end, fleet):
        raise RuntimeError("a bug in a usage reader")

    metrics = ControllerMetrics()
    schedule = RightsizingSchedule(crash, interval_s=300, window_s=HOUR, metrics=metrics, clock=world.clock,
                                   jitter=lambda low, high: high)
    leader = world.reconciler("pod-a", metrics=metrics, rightsizing=schedule)
    with caplog.at_level(logging.ERROR, logger="gpushare.rightsizing"):
        report = leader.reconcile_once()
    assert report.ok and report.published.changed  # the reconcile pass rendered and committed
    assert "right-sizing pass crashed (RuntimeError)" in caplog.text
    assert _metric(metrics, "gpushare_rightsizing_failures_total", reason="PassCrashed") == 1
    assert _metric(metrics, "gpushare_rightsizing_passes_total", result="failed") == 1
    assert schedule.next_at == world.clock() + 1.0  # controller.cli.loop's backoff: 1 s after the first failure
    assert "decisions/rightsizing/llm/chat.yaml" not in world.files()
    world.clock.now += 2
    leader.reconcile_once()
    assert schedule.failures == 2 and schedule.next_at == world.clock() + 2.0  # doubling


def test_a_leader_that_lost_its_lease_pushes_no_right_sizing_commit(git_server, tmp_path):  # noqa: F811
    class LeadershipLost(Exception):
        reason, message = "LeadershipLost", "the Lease was not renewed in time"

    def lost() -> None:
        raise LeadershipLost()

    url = git_server.create_repo("fleet", _fleet(tmp_path))
    metrics = ControllerMetrics()
    with PrometheusDouble({"llm/chat-small": _usage(GiB)}, STEP) as prom:
        schedule = RightsizingSchedule(lambda start, end, fleet: read_usage(prom.url, start, end, STEP, fleet=fleet), window_s=3 * HOUR,
                                       metrics=metrics)
        assert schedule.run_if_due(WorkingCopy(url, "main", tmp_path / "w"), guard=lost) is None
    assert not any(path.startswith("decisions/rightsizing/") for path in git_server.files("fleet"))
    assert git_server.head("fleet", "gpushare/rightsize-llm-chat-small") is None
    assert _metric(metrics, "gpushare_rightsizing_failures_total", reason="LeadershipLost") == 1


def test_the_lease_is_renewed_while_a_long_right_sizing_pass_runs(world):
    """A usage read or replay longer than the Lease must not hand the leadership over mid-pass."""
    renewed = threading.Event()
    metrics = ControllerMetrics()
    leader = world.reconciler("pod-a", metrics=metrics, renew_every_s=0.01)
    renew = leader.election.try_acquire_or_renew

    def counted() -> bool:
        renewed.set()
        return renew()

    def slow_read(start, end, fleet):
        renewed.clear()
        assert renewed.wait(10), "nothing renewed the Lease while the right-sizing pass ran"
        return []

    leader.election.try_acquire_or_renew = counted
    leader.rightsizing = RightsizingSchedule(slow_read, window_s=HOUR, metrics=metrics, clock=world.clock)
    assert leader.reconcile_once().ok
    assert _metric(metrics, "gpushare_rightsizing_passes_total", result="ok") == 1
    assert "decisions/rightsizing/llm/chat.yaml" in world.files()  # pushed: it still led
