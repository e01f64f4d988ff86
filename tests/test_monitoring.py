"""Monitoring shipped as code (deploy/overlays/monitoring): `promtool check rules` passes on the PrometheusRule,
every metric the rules and the dashboard name is one the controller or the worker exports, and every dashboard
query returns series from a real Prometheus (Debian's) scraping a real CPU worker that serves two swap models
with latency SLOs under load. Bounded: 1 s scrapes, a few seconds of load. Skipped without promtool/prometheus
(.ci/run installs them)."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
import time

import httpx
import pytest
import yaml

from controller.cli.metrics import ControllerMetrics
from tests.conftest import REPO_ROOT
from tests.test_rightsizing_prometheus import Prometheus
from worker.api import create_app
from worker.metrics import WorkerMetrics
from worker_support import (  # noqa: F401  (fixtures are used by name)
    ServerThread, config_document, model_entry, single_threaded_torch, started_worker, tiny_models,
)

MONITORING = REPO_ROOT / "deploy" / "overlays" / "monitoring"
RULES = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())
DASHBOARD = json.loads((MONITORING / "dashboards" / "gpushare-models.json").read_text())
QUERIES = [pytest.param(target["expr"], id=f"{panel['title']}:{target['refId']}")
           for panel in DASHBOARD["panels"] for target in panel["targets"]]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="Debian's prometheus (promtool) is not installed")
def test_promtool_checks_the_rules(tmp_path):
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(RULES["spec"]))
    checked = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS" in checked.stdout


def _exported() -> set[str]:
    """Every series name the controller and the worker export (counters with _total, histograms' parts)."""
    names = set()
    for registry in (ControllerMetrics().registry, WorkerMetrics(known=["m"]).registry):
        for family in registry.collect():
            base = family.name
            names |= {base, f"{base}_total", f"{base}_bucket", f"{base}_sum", f"{base}_count", f"{base}_created"}
    return names


def test_the_rules_and_the_dashboard_name_only_exported_metrics():
    text = json.dumps(RULES["spec"]) + json.dumps(DASHBOARD)
    named = set(re.findall(r"\bgpushare_[a-z0-9_]+", text))
    assert named and named <= _exported(), sorted(named - _exported())


@pytest.fixture(scope="module")
def scraped(tiny_models, tmp_path_factory):
    """A real Prometheus scraping a real CPU worker (two swap models with SLOs) after a few seconds of load."""
    if shutil.which("prometheus") is None:
        pytest.skip("Debian's prometheus is not installed")
    slo = {"slo": {"ttftMs": 500, "tpotMs": 100}}
    worker = started_worker(config_document([
        model_entry("hot", tiny_models["llama"], "swap", **slo),
        model_entry("cold", tiny_models["qwen2"], "swap", **slo)]))
    prometheus = None
    try:
        with ServerThread(create_app(worker)) as server:
            prometheus = Prometheus(tmp_path_factory.mktemp("prometheus"), f"127.0.0.1:{server.port}")
            with httpx.Client(timeout=30) as client:
                deadline = time.monotonic() + 8
                while time.monotonic() < deadline:
                    for model in ("hot", "cold"):  # alternating: each request swaps
                        reply = client.post(f"{server.base_url}/v1/completions", json={
                            "model": model, "prompt": "hello", "max_tokens": 8, "temperature": 0})
                        assert reply.status_code == 200
            time.sleep(3)  # the last scrapes
            yield prometheus
    finally:
        if prometheus is not None:
            prometheus.stop()
        worker.stop(timeout_s=5)


@pytest.mark.integration
@pytest.mark.parametrize("expr", QUERIES)
def test_every_dashboard_query_returns_series(scraped, expr):
    query = expr.replace("$model", ".*")
    reply = httpx.get(f"{scraped.url}/api/v1/query", params={"query": query}, timeout=10).json()
    assert reply["status"] == "success", reply
    models = {series["metric"].get("model") for series in reply["data"]["result"]}
    assert {"hot", "cold"} <= models, (query, reply["data"]["result"])
