"""Real parts end to end: a real Prometheus (Debian's package) scrapes a real CPU worker on 127.0.0.1 serving a
tiny model under a bounded load; the controller's reconcile loop (`reconcile --prometheus`) reads it over HTTP
(query_range) and commits a recommendation to a real git remote. The fault run stops Prometheus mid-window: the
loop holds (no budget changes, the record says UsageMissing) and the reconcile pass still runs.

Bounded: 1 s scrapes, about 8 s of load, well under a minute in all. Skipped where `prometheus` is not installed
(.ci/run installs it)."""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

from controller.cli.commands import main
from controller.rightsizing.prometheus import read_usage
from tests.gitserver import free_port, git_server  # noqa: F401  (fixture)
from worker.api import create_app
from worker_support import (  # noqa: F401  (fixtures are used by name)
    MiB, ServerThread, config_document, model_entry, started_worker, single_threaded_torch, tiny_models,
)

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("prometheus") is None, reason="Debian's prometheus is not installed")]

MODEL_FILE = """\
# chat: a tiny model; the right-sizing loop proposes its budget
apiVersion: gpushare.dev/v1alpha1
kind: ElasticModel
metadata:
  name: chat
  namespace: llm
spec:
  model: org/tiny-chat
  memoryBudget: 1Gi   # generous on purpose
  rightsizing:
    policy: Recommend
    downsizeAfter: 4s
    cooldown: 0s
"""
GPUS = "apiVersion: gpushare.dev/v1alpha1\nkind: GPUInventory\nnodes:\n- {name: node-a, product: NVIDIA-H200, memory: 141Gi}\n"


class Prometheus:
    def __init__(self, tmp: Path, target: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = tmp / "prometheus.yml"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": "gpushare-worker", "static_configs": [{"targets": [target]}]}]}))
        self.log = (tmp / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(
            ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}"], stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True)
        deadline = time.monotonic() + 15
        while True:
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert self.proc.poll() is None and time.monotonic() < deadline, "prometheus did not become ready"
            time.sleep(0.1)

    def seconds_of(self, metric: str) -> float:
        reply = httpx.get(f"{self.url}/api/v1/query", params={"query": f"count_over_time({metric}[1m])"}, timeout=5)
        result = reply.json()["data"]["result"]
        return float(result[0]["value"][1]) if result else 0.0

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        self.log.close()


def _load(base_url: str, stop: threading.Event, done: list[int]) -> None:
    """One client: short completions back to back until `stop` or 100 requests."""
    with httpx.Client(timeout=30) as client:
        for _ in range(100):
            if stop.is_set():
                return
            reply = client.post(f"{base_url}/v1/completions",
                                json={"model": "chat", "prompt": "hello there", "max_tokens": 64, "temperature": 0})
            done.append(reply.status_code)


def test_prometheus_scrapes_a_real_worker_and_the_loop_commits_then_holds_when_prometheus_stops(
        tiny_models, git_server, tmp_path, capsys):  # noqa: F811
    worker = started_worker(config_document([model_entry("chat", tiny_models["llama"], "resident",
                                                         context=256, concurrency=2)]))
    prometheus = None
    try:
        with ServerThread(create_app(worker)) as server:
            prometheus = Prometheus(tmp_path, f"127.0.0.1:{server.port}")
            stop, statuses = threading.Event(), []
            clients = [threading.Thread(target=_load, args=(server.base_url, stop, statuses)) for _ in range(2)]
            for c in clients:
                c.start()
            deadline = time.monotonic() + 25
            while prometheus.seconds_of("gpushare_worker_device_bytes") < 8 and time.monotonic() < deadline:
                time.sleep(0.5)
            stop.set()
            for c in clients:
                c.join(timeout=30)
            assert statuses and set(statuses) == {200}

            now = time.time()
            samples = read_usage(prometheus.url, now - 30, now, 1)
            present = [s for s in samples if s.model == "llm/chat" and not s.missing]
            assert len(present) >= 6
            device = worker.status()["models"][0]["deviceBytes"]
            assert max(s.device_bytes for s in present) == device
            assert any(s.kv_used_bytes for s in present) and all(s.kv_reserved_bytes for s in present)
            assert any(s.ttft_s is not None for s in present) and any(s.queue_wait_s is not None for s in present)

            url = git_server.create_repo("fleet", {"models/llm/chat.yaml": MODEL_FILE.encode(), "gpus.yaml": GPUS.encode()})
            # the installed loop, not the command: one right-sizing pass, then the reconcile pass
            loop = ["reconcile", "--offline", "--repo", url, "--once", "--workdir", str(tmp_path / "w"),
                    "--prometheus", prometheus.url, "--rightsize-window", "30s", "--rightsize-step", "1s"]
            capsys.readouterr()
            assert main(loop) == 0
            assert "usage unavailable" not in capsys.readouterr().err
            branch = "gpushare/rightsize-llm-chat"
            edited = git_server.files("fleet", branch=branch)["models/llm/chat.yaml"].decode()
            proposed = yaml.safe_load(git_server.files("fleet")["decisions/rightsizing/llm/chat.yaml"])["budgetBytes"]
            # never below the peak plus headroom, rounded up to a MiB
            assert device * 1.15 <= proposed <= device * 1.15 + MiB
            assert edited == MODEL_FILE.replace("memoryBudget: 1Gi ", f"memoryBudget: {proposed >> 20}Mi ")
            head = git_server.head("fleet", branch)

            # the same usage as a file, replayed offline with the loop's window: the proposal's budget, timestamped
            usage = tmp_path / "usage.jsonl"
            assert main(["usage", "export", "--prometheus", prometheus.url, "--since", "30s", "--step", "1s",
                         "-o", str(usage)]) == 0
            repo = tmp_path / "repo"
            (repo / "models" / "llm").mkdir(parents=True)
            (repo / "models" / "llm" / "chat.yaml").write_text(MODEL_FILE)
            capsys.readouterr()
            assert main(["rightsize", "--repo", str(repo), "--usage", str(usage), "--window", "30s"]) == 0
            replayed = capsys.readouterr().out
            assert re.search(r"\n  \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ  down  1\.0Gi → ", replayed), replayed

            prometheus.stop()  # mid-window: the next pass cannot read usage
            assert main(loop) == 0  # the loop holds: the reconcile pass still runs
            err = capsys.readouterr().err
            assert "usage unavailable, no budget changed" in err and "unreachable" in err
            assert git_server.head("fleet", branch) == head
            record = yaml.safe_load(git_server.files("fleet")["decisions/rightsizing/llm/chat.yaml"])
            assert record["budgetBytes"] == proposed  # the open proposal stands; nothing new was decided
            assert record["conditions"][0]["reason"] == "UsageMissing"
    finally:
        if prometheus is not None:
            prometheus.stop()
        worker.stop()
