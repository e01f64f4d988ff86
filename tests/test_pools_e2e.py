"""Capacity end to end: `gpushare reconcile --offline` and `gpushare consolidate` against a real git remote.

A refused model becomes placed on a new pool node once gpus.yaml gains a pool (its worker selects the pool and
requests the GPU); at the pool's maxNodes the next one is refused naming the pool, its limit and the bytes
missing; on a fragmented fleet `consolidate --propose` gives pool nodes back on a review branch, moving no more
models than the bound, and once merged the next pass follows it and commits nothing.
"""
from __future__ import annotations

import json
import re

import pytest
import yaml

from controller.cli.commands import main
from tests.conftest import REPO_ROOT
from tests.gitserver import git, git_server  # noqa: F401  (fixture)

CAPACITY = REPO_ROOT / "examples" / "capacity"
PROFILES = {p.relative_to(CAPACITY).as_posix(): p.read_bytes() for p in (CAPACITY / "profiles").rglob("*.yaml")}
ASSISTANT = """apiVersion: gpushare.dev/v1alpha1
kind: ElasticModel
metadata:
  name: {name}
  namespace: team-a
spec:
  model: meta-llama/Llama-3.1-8B-Instruct
  memoryBudget: {budget}
  slo:
    contextTokens: 8192
    concurrency: 2
  gpu:
    product: NVIDIA-L4
"""
FIXED_L4 = """apiVersion: gpushare.dev/v1alpha1
kind: GPUInventory
pricePerGpuHour:
  NVIDIA-L4: 0.8
nodes:
  - name: small-node-1          # a GPU of 10Gi: one 8B assistant streams there, a second has no room
    product: NVIDIA-L4
    memory: 10Gi
    hostMemory: 24Gi
"""
POOL = """pools:
  - name: l4
    product: NVIDIA-L4
    gpusPerNode: 1
    hostMemory: 24Gi
    maxNodes: {most}
    selector:
      karpenter.sh/nodepool: l4
"""


def run(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().out


def reconcile(capsys, url: str, workdir) -> tuple[int, str]:
    return run(capsys, "reconcile", "--offline", "--repo", url, "--once", "--workdir", str(workdir),
               "--max-prune-share", "1")


def decision(server, ref: str, branch: str = "main") -> dict:
    text = server.files("fleet", branch)[f"decisions/{ref}.yaml"].decode()
    return yaml.safe_load(text)["status"]["assigned"]


def worker(server, slot_node: str) -> dict:
    files = server.files("fleet")
    [path] = [p for p in files if p.startswith("rendered/") and f"deployment-worker-{slot_node}-" in p]
    return yaml.safe_load(files[path])


@pytest.mark.integration
def test_a_refused_model_is_placed_on_a_pool_node_and_at_max_nodes_the_refusal_names_the_pool(
        capsys, git_server, tmp_path):  # noqa: F811
    files = {**PROFILES, "gpus.yaml": FIXED_L4.encode(),
             "models/team-a/one.yaml": ASSISTANT.format(name="one", budget="20Gi").encode(),
             "models/team-a/two.yaml": ASSISTANT.format(name="two", budget="20Gi").encode()}
    url = git_server.create_repo("fleet", files)
    code, out = reconcile(capsys, url, tmp_path / "w")
    assert code == 0 and "committed" in out
    assert decision(git_server, "team-a/two")["reasonCode"] == "NoCapacity"  # the small GPU holds one of them
    one = decision(git_server, "team-a/one")

    git_server.push_files("fleet", {"gpus.yaml": (FIXED_L4 + POOL.format(most=1)).encode()}, "gpus: an L4 pool")
    code, out = reconcile(capsys, url, tmp_path / "w")
    assert code == 0 and "committed" in out
    two = decision(git_server, "team-a/two")
    assert (two["mode"], two["gpu"]) == ("resident", {"product": "NVIDIA-L4", "slot": "pool-l4-0/gpu0", "pool": "l4"})
    placement = ("gpu", "mode", "residentLayers", "footprintBytes")
    assert [decision(git_server, "team-a/one")[k] for k in placement] == [one[k] for k in placement]  # not moved
    deployment = worker(git_server, "pool-l4-0")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"karpenter.sh/nodepool": "l4"}  # no node name: the node does not exist yet
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    affinity = pod["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert affinity["labelSelector"]["matchLabels"] == {"gpushare.dev/pool-node": "pool-l4-0"}
    assert deployment["spec"]["template"]["metadata"]["labels"]["gpushare.dev/pool"] == "l4"
    assert deployment["spec"]["progressDeadlineSeconds"] == 1800
    plan_md = git_server.files("fleet")["rendered/PLAN.md"].decode()
    assert "**GPUs and cost:** 1 → 2 GPUs (NVIDIA-L4 1 → 2; pool l4 0 → 1 node) · 584.00 → 1,168.00 per month" \
        in plan_md
    code, out = reconcile(capsys, url, tmp_path / "w")
    assert code == 0 and "no change" in out  # the next pass keeps the new node's model where it is

    long_context = ASSISTANT.format(name="three", budget="40Gi").replace("contextTokens: 8192", "contextTokens: 65536")
    git_server.push_files("fleet", {"models/team-a/three.yaml": long_context.encode()},  # 16Gi of KV: a GPU of its own
                          "models: a third assistant")
    code, out = reconcile(capsys, url, tmp_path / "w")
    assert code == 0
    three = decision(git_server, "team-a/three")
    assert three["mode"] == "refused" and three["reasonCode"] == "PoolLimitReached"
    assert "pool l4" in three["reason"] and "maxNodes 1 (1 node(s) planned)" in three["reason"]
    assert re.search(r"Missing: \S+", three["reason"]) and "Raise maxNodes of pool l4" in three["reason"]


def _fragmented(git_server, tmp_path, capsys) -> str:  # noqa: F811
    files = {p.relative_to(CAPACITY).as_posix(): p.read_bytes() for p in CAPACITY.rglob("*") if p.is_file()}
    url = git_server.create_repo("fleet", files)
    code, _ = reconcile(capsys, url, tmp_path / "w")
    assert code == 0
    assert len({decision(git_server, f"team-{t}/assistant-{i}")["gpu"]["slot"] for t in "ab" for i in (1, 2, 3)}) == 6
    smaller = {}
    for team in "ab":  # the teams right-size their assistants by hand: budgets of 9Gi, each streams
        path = f"models/team-{team}/assistants.yaml"
        smaller[path] = files[path].replace(b"memoryBudget: 20Gi", b"memoryBudget: 9Gi")
    git_server.push_files("fleet", smaller, "models: smaller budgets")
    code, out = reconcile(capsys, url, tmp_path / "w")
    assert code == 0 and "committed" in out
    return url


@pytest.mark.integration
def test_consolidate_gives_pool_nodes_back_within_the_bound_and_the_next_pass_follows_it(
        capsys, git_server, tmp_path):  # noqa: F811
    url = _fragmented(git_server, tmp_path, capsys)
    before = {f"team-{t}/{n}": decision(git_server, f"team-{t}/{n}") for t in "ab"
              for n in ("assistant-1", "assistant-2", "assistant-3", "chat")}
    nodes = {d["gpu"]["slot"].split("/")[0] for d in before.values()}
    assert len(nodes) == 6  # the smaller budgets freed bytes, but a normal pass gives no node back

    main_head = git_server.head("fleet")
    code, out = run(capsys, "consolidate", "--repo", url, "--propose", "--max-moves", "2",
                    "--workdir", str(tmp_path / "c"))
    assert code == 0 and "published" in out
    assert git_server.head("fleet") == main_head  # a proposal, never the tracked branch
    branch = "gpushare/consolidation"
    after = {ref: decision(git_server, ref, branch) for ref in before}
    moved = [ref for ref in before if before[ref]["gpu"]["slot"] != after[ref]["gpu"]["slot"]]
    assert 1 <= len(moved) <= 2
    assert len({d["gpu"]["slot"].split("/")[0] for d in after.values()}) == 6 - len(moved)
    assert all(after[ref]["mode"] != "refused" for ref in after)
    log = git("log", "-1", "--format=%B", branch, cwd=git_server.path("fleet"))
    assert log.startswith(f"gpushare consolidate: give back {len(moved)} pool node")
    assert "3,504.00 → " in log and all(f"{ref}: " in log for ref in moved)
    files = git_server.files("fleet", branch)
    gone = [p for p in git_server.files("fleet") if "deployment-worker-pool-l4" in p and p not in files]
    assert len(gone) == len(moved)  # each node given back loses its worker: the autoscaler removes it

    git("push", "-q", ".", f"{branch}:main", cwd=git_server.path("fleet"))  # the reviewer merges it
    code, out = reconcile(capsys, url, tmp_path / "w")
    assert code == 0 and "no change" in out  # the pass keeps the merged decisions: no churn


@pytest.mark.integration
def test_consolidate_on_a_directory_prints_the_proposal_and_plan_json_shows_the_bill(capsys, git_server, tmp_path):  # noqa: F811
    url = _fragmented(git_server, tmp_path, capsys)
    checkout = tmp_path / "checkout"
    git("clone", "-q", url, str(checkout))
    code, out = run(capsys, "consolidate", str(checkout))
    assert code == 0 and out.startswith("gpushare consolidate: give back 3 pool nodes (3 GPUs), 3 models move")
    assert "3,504.00 → 1,752.00 per month" in out
    code, out = run(capsys, "plan", str(checkout), "-o", "json")
    capacity = json.loads(out)["capacity"]
    assert capacity["gpusUsed"] == 6 and capacity["costPerMonth"] == 3504.0
    assert capacity["consolidatedCostPerMonth"] == 1752.0
    assert capacity["pools"] == [{"name": "l4", "product": "NVIDIA-L4", "nodes": 6, "gpus": 6, "minNodes": 0,
                                  "maxNodes": 8, "existingNodes": None, "costPerMonth": 3504.0}]


@pytest.mark.integration
def test_the_cluster_loops_schedule_publishes_the_proposal_when_due_and_only_once(capsys, git_server, tmp_path):  # noqa: F811
    from controller.cli.common import controller_copy
    from controller.cli.consolidate import CONSOLIDATION_BRANCH, ConsolidationSchedule
    from controller.passes.measured import ClusterFacts

    url = _fragmented(git_server, tmp_path, capsys)
    now = [1_800_000_000.0]
    reviewed = []
    schedule = ConsolidationSchedule(3600, 2, clock=lambda: now[0], review=lambda new, published: reviewed.append(
        published.branch))
    copy = controller_copy(url, "main", tmp_path / "cluster")
    facts = ClusterFacts(slots=(), profiles=())  # cluster mode: no fixed GPU node, the pool's nodes not up yet
    first = schedule.run_if_due(copy, facts, None, lambda: None)
    assert first is not None and first.published.changed and len(first.proposal.moves) == 2
    assert git_server.head("fleet", CONSOLIDATION_BRANCH) == first.published.commit and reviewed == [CONSOLIDATION_BRANCH]
    assert schedule.run_if_due(copy, facts, None, lambda: None) is None  # not due again for an hour
    now[0] += 3600
    again = schedule.run_if_due(copy, facts, None, lambda: None)
    assert again is not None and not again.published.changed  # the branch holds this proposal already
    assert reviewed == [CONSOLIDATION_BRANCH]
    assert not ConsolidationSchedule(0, 2).due()  # --consolidate-interval 0: never
