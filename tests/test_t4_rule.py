"""The Tesla-T4 rule (compute capability 7.5: no bfloat16, no int4 kernel), faked on both sides of a profile.

The profiler Job, on a CPU run for --gpu-product Tesla-T4, takes the catalog's capability; the worker is
given a T4's capability in place of its device's. Both go through contract.precision.choose: a bfloat16
checkpoint runs in float16, int8 weights run, int4 is refused with the reason, and the bytes the profile
measures are the bytes the worker admits.
"""
from __future__ import annotations

import pytest
import torch
import yaml

import worker.runtime
from profiler_job.cli import main as profiler_main
from profiler_job.run import Adapters
from tinymodels import save_tiny_model
from worker_support import (Collector, config_document, generation, model_entry,  # noqa: F401
                            single_threaded_torch, started_worker)

T4 = (7, 5)


@pytest.fixture(scope="module")
def bf16_model(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("t4") / "llama", "llama", dtype="bfloat16")


def run_profiler(model, weights: str, tmp_path):
    out, log = tmp_path / f"{weights}.yaml", tmp_path / f"{weights}.log"
    code = profiler_main(["--model", str(model), "--weights", weights, "--gpu-product", "Tesla-T4",
                          "--context-tokens", "64", "--repeats", "1", "--out", f"file:{out}",
                          "--termination-log", str(log)], adapters=Adapters(cuda_available=lambda: False))
    return code, (yaml.safe_load(out.read_text()) if out.exists() else None), (log.read_text() if log.exists() else "")


@pytest.fixture
def on_a_t4(monkeypatch):
    """The worker's device reports a Tesla-T4's compute capability (the CPU still computes)."""
    monkeypatch.setattr(worker.runtime, "device_capability", lambda device: T4)


@pytest.mark.parametrize("weights", ["auto", "int8"])
def test_profiler_and_worker_choose_float16_and_count_the_same_bytes(bf16_model, weights, tmp_path, on_a_t4):
    code, profile, log = run_profiler(bf16_model, weights, tmp_path)
    assert code == 0, log
    assert profile["dtype"] == "float16" and profile["weights"].get("dtype", "auto") == weights
    entry = model_entry("m", bf16_model, "resident", weightDtype=weights)
    worker = started_worker(config_document([entry]))
    try:
        shape = worker.shapes["m"]
        assert shape.dtype == "float16" and list(shape.layer_bytes) == profile["weights"]["layerBytes"]
        assert shape.embedding_bytes == profile["weights"]["embeddingBytes"]
        assert worker.verdicts["m"].verdict == "applied"
        sink = Collector()
        worker.submit("m", generation(tokens=4), sink)
        assert sink.done.wait(30) and next(iter(worker.served["m"].residency.model.parameters())).dtype == torch.float16
    finally:
        worker.stop()


def test_int4_on_a_t4_is_refused_by_both_with_the_reason(bf16_model, tmp_path, on_a_t4):
    code, profile, log = run_profiler(bf16_model, "int4", tmp_path)
    assert (code, profile) == (17, None) and log.startswith("UnsupportedWeightDtype: int4 weights need compute "
                                                            "capability 8.0")
    worker = started_worker(config_document([model_entry("m", bf16_model, "resident", weightDtype="int4")]))
    try:
        verdict = worker.verdicts["m"]
        assert (verdict.verdict, verdict.reason) == ("refused", "UnsupportedWeightDtype")
        assert "set spec.weights.dtype to int8" in verdict.message
    finally:
        worker.stop()


def test_without_the_fake_the_cpu_runs_the_checkpoints_bfloat16(bf16_model):
    worker = started_worker(config_document([model_entry("m", bf16_model, "resident")]))
    try:
        assert worker.shapes["m"].dtype == "bfloat16"
    finally:
        worker.stop()
