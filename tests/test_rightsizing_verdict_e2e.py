"""One system, one decision, end to end: a right-sizing record's verdict (InPlace, Move, NeedsCapacity) is what
the next reconcile pass does, through the real commands against a real git remote (git daemon on 127.0.0.1).

Each case seeds a GitOps repo (the Auto model chat beside two neighbours, a toy profile, gpus.yaml), lets
`gpushare reconcile --offline --once` plan it, changes the inventory where the case needs it, runs one
right-sizing pass (controller.rightsizing.apply.rightsize_once) with usage that breaches (an out-of-memory
failure: a breach more memory relieves), then one more reconcile pass, and reads both committed files from git:
decisions/<ns>/<name>.yaml (what the plan did) and decisions/rightsizing/<ns>/<name>.yaml (what the
record said it would do). A NeedsCapacity record's bytes missing are the plan's own figure.
"""
from __future__ import annotations

import pytest
import yaml

from contract.quantity import paste_quantity
from controller.cli.commands import main
from controller.rightsizing.apply import rightsize_once
from controller.rightsizing.usage import Sample
from gitops import WorkingCopy
from tests.gitserver import git_server  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration

MiB = 1 << 20
RESERVED = 1024 * MiB  # gpus.yaml's default `reserved`
PRODUCT = "NVIDIA-TEST"
NOW = 1_800_000_000.0
CHAT = "decisions/llm/chat.yaml"
RECORD = "decisions/rightsizing/llm/chat.yaml"


def _model(name: str, budget_mib: int, rightsizing: str = "") -> str:
    return (f"apiVersion: gpushare.dev/v1alpha1\nkind: ElasticModel\nmetadata:\n  name: {name}\n  namespace: llm\n"
            f"spec:\n  model: org/toy\n  memoryBudget: {budget_mib}Mi\n  slo:\n    contextTokens: 100\n"
            f"    concurrency: 1\n  gpu:\n    product: {PRODUCT}\n{rightsizing}")


def _profile() -> str:
    """org/toy on the test product: 10 layers of 100 MiB, embeddings and head 100 MiB each (1.2 GiB whole)."""
    layer = 100 * MiB
    return yaml.safe_dump({
        "apiVersion": "gpushare.dev/v1alpha1", "kind": "ModelProfile", "model": "org/toy", "revision": "main",
        "dtype": "bfloat16", "source": "estimated", "method": "a test profile with round numbers",
        "gpu": {"product": PRODUCT, "memoryBytes": 8 << 30, "hbmGBps": 1000.0}, "hostToDeviceGBps": 10.0,
        "weights": {"embeddingBytes": layer, "layerBytes": [layer] * 10, "finalNormBytes": 0, "headBytes": layer,
                    "tiedEmbeddings": False, "totalBytes": 12 * layer},
        "kvCache": {"bytesPerToken": 1},
        "activation": {"prefillBytesPerToken": 0, "prefillChunkTokens": 512, "decodeBytesPerSequence": 0},
        "runtimeOverheadBytes": 0, "derivation": {"weights": "round numbers for a test"},
        "latency": {"decodeMsPerToken": 10.0, "prefillMsPer1kTokens": 100.0}})


def _gpus(*nodes: tuple) -> bytes:
    """One GPU per node (name, usable MiB beside the default 1 GiB reserve[, host RAM MiB])."""
    lines = "".join(f"  - name: {name}\n    product: {PRODUCT}\n    memory: {usable + RESERVED // MiB}Mi\n"
                    "    count: 1\n" + (f"    hostMemory: {host[0]}Mi\n" if host else "")
                    for name, usable, *host in nodes)
    return f"apiVersion: gpushare.dev/v1alpha1\nkind: GPUInventory\nnodes:\n{lines}".encode()


def _breaching(start: float, end: float, fleet=None) -> list[Sample]:
    """chat at its 800 MiB budget for ten minutes, with an out-of-memory failure (more memory is the remedy)."""
    return [Sample(time=t, model="llm/chat", device_bytes=800 * MiB, ooms=int(i == 5))
            for i, t in enumerate(NOW - 540 + 60 * k for k in range(10)) if start <= t <= end]


def _slot(assigned: dict) -> str | None:
    return (assigned.get("gpu") or {}).get("slot")


AUTO = "  rightsizing:\n    policy: Auto\n    upsizeAfter: 1m\n"

# (first inventory, inventory at the right-sizing pass, the verdict). The neighbours (1.2 GiB resident each) sort
# before chat: where the planner must refuse one of equals, it refuses the later name, so chat.
CASES = [
    pytest.param([("node-a", 3300), ("node-b", 1600)], None, "InPlace", id="in-place-room-beside-the-neighbour"),
    pytest.param([("node-a", 2200)], [("node-a", 2200), ("node-b", 1600)], "Move",
                 id="move-to-a-gpu-that-joined-since-the-last-plan"),
    # its GPU shrank and pins little host RAM (no swap): the upsized chat stays, resident, and a neighbour gives way
    pytest.param([("node-a", 2200)], [("node-a", 1550, 1024)], "InPlace",
                 id="in-place-on-a-shrunk-gpu-the-neighbour-gives-way"),
    pytest.param([("node-a", 2200), ("node-b", 1300)], [("node-b", 1300, 1024)], "NeedsCapacity",
                 id="needs-capacity-its-gpu-left-and-the-other-is-full"),  # no room even to stream it
]


@pytest.mark.parametrize("first,later,verdict", CASES)
def test_a_records_verdict_is_what_the_next_reconcile_pass_does(git_server, tmp_path, first, later,
                                                                verdict):  # noqa: F811
    url = git_server.create_repo("fleet", {
        "models/llm/chat.yaml": _model("chat", 800, AUTO).encode(),
        "models/llm/assistant.yaml": _model("assistant", 1300).encode(),
        "models/llm/batch.yaml": _model("batch", 1300).encode(),
        f"profiles/{PRODUCT}/org--toy.yaml": _profile().encode(), "gpus.yaml": _gpus(*first)})

    def reconcile() -> dict[str, dict]:
        assert main(["reconcile", "--offline", "--repo", url, "--once", "--workdir", str(tmp_path / "r"),
                     "--max-prune-share", "1"]) == 0  # a case takes a GPU and its worker away
        files = git_server.files("fleet")
        return {path: yaml.safe_load(files[path]) for path in (CHAT, RECORD) if path in files}

    before = reconcile()[CHAT]["status"]["assigned"]
    assert _slot(before) == "node-a/gpu0"
    if later is not None:
        git_server.push_files("fleet", {"gpus.yaml": _gpus(*later)}, "the inventory changes")
    result = rightsize_once(WorkingCopy(url, "main", tmp_path / "w"), _breaching, NOW, 3600.0)
    assert result.usage_error is None and result.records.commit
    after = reconcile()
    record, assigned = after[RECORD], after[CHAT]["status"]["assigned"]

    assert record["fit"]["kind"] == verdict
    if verdict == "NeedsCapacity":  # Auto keeps its budget; the plan refused it and says the same bytes missing
        assert record["budgetBytes"] == record["specBudgetBytes"] == assigned["budgetBytes"] == 800 * MiB
        assert assigned["mode"] == "refused" and _slot(assigned) is None
        missing = record["fit"]["missingBytes"]
        assert missing > 0 and record["fit"]["product"] == PRODUCT
        assert f"Missing: {paste_quantity(missing)}" in assigned["reason"]
        needs = next(c for c in record["conditions"] if c["type"] == "NeedsCapacity")
        assert needs["status"] == "True" and needs["message"] == record["fit"]["message"]
        return
    assert record["budgetBytes"] > record["specBudgetBytes"] == 800 * MiB  # Auto applies the upsize
    assert assigned["budgetBytes"] == record["budgetBytes"] and assigned["mode"] != "refused"
    assert _slot(assigned) == record["fit"]["slot"]  # the slot the record named is the one the plan gave
    assert (_slot(assigned) == _slot(before)) == (verdict == "InPlace")  # in place: the same; move: another
    assert assigned["mode"] in record["fit"]["message"]  # and in the mode the record said
