"""The worker's per-model metrics: Prometheus names, device bytes read from ledgers, bounded labels,
GPU busy time, NVML of other processes (and its absence), and a real worker's /metrics after load."""
from __future__ import annotations

import threading

import httpx
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from worker.api import create_app
from worker.metrics import GpuProcess, WorkerMetrics
from worker_support import (  # noqa: F401  (fixtures are used by name)
    MiB, ServerThread, config_document, model_entry, started_worker, single_threaded_torch, tiny_models,
)


class _Ledger:
    def __init__(self, placed: int, kv: int, activation: int, peak: int):
        self.placed_bytes, self._reserved, self.peak_bytes = placed, {"kv-cache": kv, "activation": activation}, peak

    @property
    def total_bytes(self) -> int:
        return self.placed_bytes + sum(self._reserved.values())

    def reserved(self, label: str) -> int:
        return self._reserved.get(label, 0)


def _samples(metrics: WorkerMetrics) -> dict[tuple[str, tuple], float]:
    text = generate_latest(metrics.registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_device_bytes_come_from_the_ledger_at_scrape_time_and_kv_in_use_is_capped_by_the_reservation():
    metrics = WorkerMetrics(known=["chat"])
    ledger = _Ledger(placed=1000, kv=4096, activation=512, peak=6000)
    metrics.serve("chat", "resident", ledger, kv_bytes_per_token=16, kv_reserved_bytes=4096)
    metrics.in_flight("chat", sequences=2, tokens=100)
    got = _samples(metrics)
    model = (("model", "chat"),)
    assert got[("gpushare_worker_device_bytes", (("mode", "resident"), ("model", "chat")))] == 1000 + 4096 + 512
    assert got[("gpushare_worker_weight_device_bytes", model)] == 1000
    assert got[("gpushare_worker_kv_reserved_bytes", model)] == 4096
    assert got[("gpushare_worker_kv_used_bytes", model)] == 1600
    assert got[("gpushare_worker_peak_device_bytes", model)] == 6000
    assert got[("gpushare_worker_sequences_in_flight", model)] == 2
    ledger.placed_bytes = 0  # a swap model evicted: the next scrape sees it without any push
    metrics.in_flight("chat", sequences=4, tokens=10_000)
    got = _samples(metrics)
    assert got[("gpushare_worker_device_bytes", (("mode", "resident"), ("model", "chat")))] == 4096 + 512
    assert got[("gpushare_worker_kv_used_bytes", model)] == 4096


def test_unknown_model_names_count_in_one_series_and_do_not_grow_the_exposition():
    metrics = WorkerMetrics(known=["chat"])
    metrics.reject("chat", 400, "InvalidRequest")
    before = len(generate_latest(metrics.registry))
    for i in range(200):
        metrics.reject(f"no-such-model-{i}-" + "x" * 200, 404, "ModelNotFound")
    text = generate_latest(metrics.registry).decode()
    assert len(text) - before < 100  # only the counter's value changed
    assert "no-such-model" not in text
    got = _samples(metrics)
    assert got[("gpushare_worker_unknown_model_requests_total", ())] == 200
    assert got[("gpushare_worker_rejected_requests_total",
                (("model", "chat"), ("reason", "InvalidRequest"), ("status", "400")))] == 1


def test_busy_time_on_cpu_is_the_wall_time_of_the_step_and_only_for_served_models():
    metrics = WorkerMetrics(known=["chat"])
    metrics.serve("chat", "resident", _Ledger(1, 1, 1, 1), kv_bytes_per_token=1, kv_reserved_bytes=1)
    done = threading.Event()
    with metrics.busy("chat", "cpu"):
        done.wait(0.02)
    with metrics.busy("not-served", "cpu"):
        pass
    got = _samples(metrics)
    assert got[("gpushare_worker_gpu_busy_seconds_total", (("model", "chat"),))] >= 0.02
    assert not any(labels == (("model", "not-served"),) for _, labels in got)


class _FakeNvml:
    def __init__(self, processes, fail=False):
        self._processes, self._fail = processes, fail

    def processes(self):
        if self._fail:
            raise RuntimeError("NVML_ERROR_UNKNOWN")
        return self._processes

    def memory(self):
        return 7000, 10_000


def test_nvml_reports_memory_of_other_processes_on_the_gpu_separately_from_this_worker():
    import os

    metrics = WorkerMetrics(nvml=_FakeNvml([GpuProcess(os.getpid(), 3000), GpuProcess(1, 2500), GpuProcess(2, 500)]))
    got = _samples(metrics)
    assert got[("gpushare_worker_nvml_process_device_bytes", ())] == 3000
    assert got[("gpushare_worker_nvml_other_processes_device_bytes", ())] == 3000
    assert got[("gpushare_worker_nvml_other_processes", ())] == 2
    assert got[("gpushare_worker_nvml_device_total_bytes", ())] == 10_000


@pytest.mark.parametrize("nvml", [None, _FakeNvml([], fail=True)], ids=["nvml-absent", "nvml-error-this-scrape"])
def test_nvml_metrics_are_absent_when_nvml_is_not_there_or_fails(nvml):
    text = generate_latest(WorkerMetrics(nvml=nvml).registry).decode()
    assert "gpushare_worker_nvml_" not in text


def test_a_real_worker_exports_per_model_usage_after_serving_requests(tiny_models):
    models = [model_entry("chat", tiny_models["llama"], "resident"),
              model_entry("coder", tiny_models["qwen2"], "swap"),
              model_entry("writer", tiny_models["gpt2"], "elastic", residentLayers=1)]
    worker = started_worker(config_document(models))
    try:
        with ServerThread(create_app(worker)) as thread:
            for name in ("chat", "coder", "writer"):
                reply = httpx.post(f"{thread.base_url}/v1/completions", timeout=30,
                                   json={"model": name, "prompt": "hello", "max_tokens": 3, "temperature": 0})
                assert reply.status_code == 200, reply.text
            assert httpx.post(f"{thread.base_url}/v1/completions", timeout=30,
                              json={"model": "nope" * 50, "prompt": "x"}).status_code == 404
            text = httpx.get(f"{thread.base_url}/metrics", timeout=10).text
    finally:
        worker.stop()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("chat", "coder", "writer"):
        label = {"model": name}
        busy = [s.value for s in families["gpushare_worker_gpu_busy_seconds"].samples if s.labels == label]
        assert busy and busy[0] > 0, f"{name}: no GPU busy time"
        wait = [s for s in families["gpushare_worker_queue_wait_seconds"].samples
                if s.name.endswith("_count") and s.labels == label]
        assert wait and wait[0].value == 1, f"{name}: queue wait not observed once"
        reserved = [s.value for s in families["gpushare_worker_kv_reserved_bytes"].samples if s.labels == label]
        assert reserved and reserved[0] > 0
    assert "gpushare_worker_unknown_model_requests_total 1.0" in text
    assert "nopenope" not in text
    streamed = [s.value for s in families["gpushare_worker_streamed_bytes"].samples if s.labels == {"model": "writer"}]
    assert streamed and streamed[0] > 0


@pytest.mark.parametrize("error,counted", [
    (type("OutOfMemoryError", (RuntimeError,), {})("CUDA out of memory. Tried to allocate 2.00 GiB"), True),
    (RuntimeError("CUDA error: out of memory"), True),
    (ValueError("index out of range"), False),
], ids=["torch-oom-type", "allocator-message", "other-error"])
def test_failed_steps_count_as_out_of_memory_only_when_they_were(error, counted):
    metrics = WorkerMetrics(known=["chat"])
    metrics.failed_step("chat", error)
    got = _samples(metrics).get(("gpushare_worker_out_of_memory_total", (("model", "chat"),)), 0)
    assert got == (1 if counted else 0)
