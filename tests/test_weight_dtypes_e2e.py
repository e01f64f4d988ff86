"""int8 and int4 end to end on CPU: profiled, planned, rendered, admitted and served through the OpenAI API.

Two ElasticModels ask for `spec.weights.dtype` int8 and int4 of tiny saved models (Llama, Qwen2, GPT-2).
The profiler Job (`python -m profiler_job`, a CPU run estimating for an NVIDIA-H200) measures each in its
weight dtype; one offline reconcile pass over the tree plans them and renders the worker's ConfigMap; that
worker.yaml runs as `python -m worker` and the official openai client chats with both. The worker's
verdicts must carry exactly the bytes the plan placed (plan = admission), and its /status the precision.
"""
from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest
import yaml

from controller.inputs.reader import read_repo
from controller.passes.reconcile import run_pass
from profiler_job.cli import main as profiler_main
from profiler_job.run import Adapters
from worker_support import WorkerProcess, single_threaded_torch  # noqa: F401  (fixture used by name)

from tinymodels import save_tiny_model

GPUS = """apiVersion: gpushare.dev/v1alpha1
kind: GPUInventory
nodes:
  - name: node-a
    product: NVIDIA-H200
    memory: 143771Mi
    hostMemory: 64Gi
"""


def elastic_model(name: str, path: Path, weights: str, budget: str = "2Gi") -> str:
    return f"""apiVersion: gpushare.dev/v1alpha1
kind: ElasticModel
metadata:
  name: {name}
  namespace: llm
spec:
  model: {path}
  memoryBudget: {budget}
  weights:
    dtype: {weights}
  slo:
    contextTokens: 128
    concurrency: 2
  gpu:
    product: NVIDIA-H200
"""


def profile(model: Path, weights: str, out: Path) -> dict:
    log = out.with_suffix(".log")
    code = profiler_main(["--model", str(model), "--weights", weights, "--gpu-product", "NVIDIA-H200",
                          "--context-tokens", "128", "--concurrency", "2", "--repeats", "1",
                          "--out", f"file:{out}", "--termination-log", str(log)],
                         adapters=Adapters(cuda_available=lambda: False))
    assert code == 0, log.read_text() if log.exists() else code
    return yaml.safe_load(out.read_text())


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """The GitOps tree (models, profiles, gpus.yaml), the pass's rendered files, and the profiles by name."""
    root = tmp_path_factory.mktemp("weights-fleet")
    repo = root / "repo"
    (repo / "models" / "llm").mkdir(parents=True)
    (repo / "gpus.yaml").write_text(GPUS)
    docs = {}
    for name, family, weights in (("llama-int8", "llama", "int8"), ("qwen2-int4", "qwen2", "int4"),
                                  ("gpt2-int8", "gpt2", "int8")):
        model = save_tiny_model(root / family, family)
        (repo / "models" / "llm" / f"{name}.yaml").write_text(elastic_model(name, model, weights))
        out = repo / "profiles" / "NVIDIA-H200" / weights / f"{name}.yaml"
        out.parent.mkdir(parents=True, exist_ok=True)
        docs[name] = profile(model, weights, out)
    output = run_pass(read_repo(repo))
    return repo, output, docs


def test_the_profiles_carry_the_weight_dtype_and_the_quantized_bytes(fleet):
    _, _, docs = fleet
    for name, doc in docs.items():
        weights = name.rsplit("-", 1)[1]
        assert doc["weights"]["dtype"] == weights
        # int4 on an NVIDIA-H200 computes in bfloat16 (the tinygemm kernel's), int8 keeps the checkpoint's float32
        assert doc["dtype"] == ("bfloat16" if weights == "int4" else "float32"), name


def test_the_plan_places_both_resident_with_their_dtype_in_the_decision(fleet):
    _, output, _ = fleet
    assert output.inputs.errors == () and output.rendered.errors == ()
    decisions = {d.name: d for d in output.plan.decisions}
    assert set(decisions) == {"llama-int8", "qwen2-int4", "gpt2-int8"}
    for name, d in decisions.items():
        assert (d.mode, d.weight_dtype) == ("resident", name.rsplit("-", 1)[1]), d.reason
        assert d.profile.endswith(f"@NVIDIA-H200/{d.weight_dtype}")
    status = yaml.safe_load(output.rendered.files["decisions/llm/qwen2-int4.yaml"])["status"]["assigned"]
    assert status["weightDtype"] == "int4"


@pytest.fixture(scope="module")
def worker_config(fleet):
    _, output, _ = fleet
    [configmap] = [text for path, text in output.rendered.files.items() if "/configmap-worker-" in path]
    return yaml.safe_load(yaml.safe_load(configmap)["data"]["worker.yaml"])


def test_the_rendered_worker_config_carries_the_weight_dtype_and_the_profiles_terms(fleet, worker_config):
    _, _, docs = fleet
    entries = {m["name"]: m for m in worker_config["models"]}
    for name, doc in docs.items():
        entry = entries[name]
        assert (entry["weightDtype"], entry["dtype"]) == (doc["weights"]["dtype"], doc["dtype"])
        layers = [run["bytes"] for run in entry["footprint"]["layerRuns"] for _ in range(run["count"])]
        assert layers == doc["weights"]["layerBytes"]


def test_python_m_worker_admits_the_planned_bytes_and_serves_both_through_the_openai_client(fleet, worker_config,
                                                                                           tmp_path):
    _, output, _ = fleet
    planned = {d.name: d.footprint_bytes for d in output.plan.decisions}
    document = {**worker_config, "device": "cpu"}
    with WorkerProcess(tmp_path, document) as worker:
        status = httpx.get(f"{worker.base_url}/status", timeout=10).json()
        for entry in status["models"]:
            assert (entry["verdict"], entry["needBytes"]) == ("applied", planned[entry["name"]]), entry
            assert entry["weightDtype"] == entry["name"].rsplit("-", 1)[1]
        client = openai.OpenAI(base_url=f"{worker.base_url}/v1", api_key="unused", max_retries=0)
        for name in planned:
            reply = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "Hello"}],
                                                   max_tokens=6, temperature=0)
            assert reply.model == name and reply.usage.completion_tokens == 6
            streamed = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "Hello"}],
                                                      max_tokens=6, temperature=0, stream=True)
            assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == \
                reply.choices[0].message.content
