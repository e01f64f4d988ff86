"""The profiler Job end to end on CPU with tiny random Llama, Qwen2 and GPT-2 models saved locally.

Checks the issue's acceptance criteria: exact weight bytes, tied embeddings
counted once, KV bytes/token equal to the formula and to a real cache, a
profile that validates, and one exit code plus one termination line per failure.
"""
from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import httpx2
import pytest
import torch
import yaml
from huggingface_hub.errors import GatedRepoError, HfHubHTTPError
from transformers import AutoModelForCausalLM, BertConfig

import schemas
from contract.estimate import architecture_from_config, estimate_profile
from contract.gpu_catalog import gpu_spec
from profiler_job import errors
from profiler_job.cli import main
from profiler_job.measure.device import Device
from profiler_job.measure.kv import measure_kv
from profiler_job.progress import STAGES
from profiler_job.run import Adapters
from tests.conftest import REPO_ROOT
from tests.tinymodels import save_tiny_model

MODELS = {  # id -> (family, tied); the tiny configs have 4 layers, hidden 64, 4 heads
    "llama": ("llama", False),
    "llama-tied": ("llama", True),
    "qwen2": ("qwen2", False),
    "qwen2-tied": ("qwen2", True),
    "gpt2": ("gpt2", False),
    "gpt2-tied": ("gpt2", True),
}
# 2 (K, V) x 4 layers x KV heads x head dim 16 x 4 bytes (float32): Llama/Qwen2 have 2 KV heads, GPT-2 has 4.
KV_BYTES_PER_TOKEN = {"llama": 2 * 4 * 2 * 16 * 4, "qwen2": 2 * 4 * 2 * 16 * 4, "gpt2": 2 * 4 * 4 * 16 * 4}
FAST = ["--gpu-product", "Tesla T4", "--context-tokens", "32", "--repeats", "2"]
CPU_ONLY = Adapters(cuda_available=lambda: False)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("profiler-models")
    return {name: save_tiny_model(root / name, family, tied=tied) for name, (family, tied) in MODELS.items()}


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> Path:
    """An encoder (BERT) saved locally: transformers maps it to a causal-LM head, the profiler must refuse it."""
    directory = tmp_path_factory.mktemp("profiler-bert")
    config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64)
    AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    return directory


def run_profiler(args: list[str], tmp_path: Path, adapters: Adapters = CPU_ONLY, tty: bool = False):
    """(exit code, profile or None, termination-log text or None, stderr text)."""
    out, log, stderr = tmp_path / "profile.yaml", tmp_path / "termination-log", io.StringIO()
    out_flag = [] if "--out" in args else ["--out", f"file:{out}"]
    code = main([*args, *out_flag, "--termination-log", str(log)], adapters=adapters, stderr=stderr, tty=tty)
    profile = yaml.safe_load(out.read_text()) if out.exists() else None
    return code, profile, log.read_text() if log.exists() else None, stderr.getvalue()


def parameter_bytes(directory: Path) -> int:
    model = AutoModelForCausalLM.from_pretrained(directory)
    return sum(p.numel() * p.element_size() for p in model.parameters())  # parameters() yields tied ones once


@pytest.fixture(scope="session")
def profiled(tiny_models, tmp_path_factory):
    """name -> (exit code, profile, termination log, stderr) of one CPU run per tiny model, made on first use."""
    runs: dict[str, tuple] = {}

    def run(name: str) -> tuple:
        if name not in runs:
            runs[name] = run_profiler(["--model", str(tiny_models[name]), *FAST], tmp_path_factory.mktemp(name))
        return runs[name]
    return run


@pytest.mark.parametrize("name", MODELS)
def test_profile_on_cpu_validates_and_counts_every_weight_byte_once(name, tiny_models, profiled):
    family, tied = MODELS[name]
    code, profile, log, _ = profiled(name)

    assert (code, log) == (0, None)
    assert not list(schemas.validator("profile").iter_errors(profile))
    weights = profile["weights"]
    assert weights["totalBytes"] == parameter_bytes(tiny_models[name])
    assert weights["totalBytes"] == (weights["embeddingBytes"] + sum(weights["layerBytes"])
                                     + weights["finalNormBytes"] + weights["headBytes"])
    assert len(weights["layerBytes"]) == 4 and len(set(weights["layerBytes"])) == 1
    assert weights["tiedEmbeddings"] is tied
    assert (weights["headBytes"] == 0) is tied
    assert profile["kvCache"]["bytesPerToken"] == KV_BYTES_PER_TOKEN[family]
    assert profile["gpu"]["product"] == "Tesla-T4"
    assert profile["source"] == "estimated"
    assert profile["derivation"]["weights"].startswith("measured")
    assert "measured on cpu" in profile["derivation"]["latency.decodeMsPerToken"]
    assert profile["activation"]["prefillChunkTokens"] == 32
    assert "layerCopyMs" not in profile


@pytest.mark.parametrize("name", ["llama", "qwen2-tied", "gpt2"])
def test_cpu_run_takes_what_it_cannot_measure_from_the_controller_estimate(name, tiny_models, profiled):
    profile = profiled(name)[1]
    config = json.loads((tiny_models[name] / "config.json").read_text())
    estimate = estimate_profile(architecture_from_config(config), profile["model"], gpu_spec("Tesla-T4"), "float32")

    assert profile["architecture"] == estimate["architecture"]
    for field in ("prefillBytesPerToken", "decodeBytesPerSequence"):
        assert profile["activation"][field] == estimate["activation"][field]
        assert profile["derivation"][f"activation.{field}"].startswith("not measured (no CUDA device)")
    assert profile["runtimeOverheadBytes"] == estimate["runtimeOverheadBytes"]
    assert profile["hostToDeviceGBps"] == estimate["hostToDeviceGBps"]
    assert profile["gpu"] == {"product": "Tesla-T4", "memoryBytes": estimate["gpu"]["memoryBytes"],
                              "hbmGBps": estimate["gpu"]["hbmGBps"]}
    assert profile["kvCache"] == estimate["kvCache"]  # measured here, computed there: the same bytes


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
def test_tied_head_is_the_only_difference_between_tied_and_untied(family, profiled):
    untied, tied = profiled(family)[1]["weights"], profiled(f"{family}-tied")[1]["weights"]
    head = 64 * (256 + 2) * 4  # hidden x vocab x float32: the one matrix a tied model does not hold twice
    assert untied["headBytes"] == head
    assert untied["totalBytes"] - tied["totalBytes"] == head
    assert tied["embeddingBytes"] == untied["embeddingBytes"]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_dtype_flag_sets_profile_dtype_and_halves_bytes(dtype, tiny_models, tmp_path):
    code, profile, _, _ = run_profiler(["--model", str(tiny_models["llama"]), "--dtype", dtype, *FAST], tmp_path)
    assert code == 0
    assert profile["dtype"] == dtype
    assert profile["kvCache"]["bytesPerToken"] == KV_BYTES_PER_TOKEN["llama"] // 2
    assert profile["weights"]["totalBytes"] == parameter_bytes(tiny_models["llama"]) // 2


def test_kv_formula_that_disagrees_with_the_real_cache_is_an_error(tiny_models):
    model = AutoModelForCausalLM.from_pretrained(tiny_models["llama"]).eval()
    model.config.num_key_value_heads = 1  # the config now claims half the KV heads the model really caches
    with pytest.raises(errors.KVCacheMismatch, match="2 x 4 layers x 1 KV heads"):
        measure_kv(model, Device("cpu"))


def _raising(exc: BaseException):
    def from_pretrained(*_args, **_kwargs):
        raise exc
    return from_pretrained


def _hub_error(kind: type[HfHubHTTPError], status: int) -> HfHubHTTPError:
    """What huggingface_hub's snapshot_download raises for a refused download."""
    request = httpx2.Request("GET", "https://hub.invalid/api/models/org/gated/revision/main")
    return kind(f"{status} Client Error: access to model org/gated is restricted (token hf_AbCdEfGh12345678)",
                response=httpx2.Response(status, request=request))


def _downloaded(*_args, **_kwargs) -> str:
    """A download that finds the files in the cache (this folder): the loader is what fails next."""
    return "."


FAILURES = [  # id, argv (without --out/--termination-log), adapters, expected error
    ("model-path-missing", ["--model", "/nonexistent/model", *FAST], CPU_ONLY, errors.ModelNotFound),
    ("hub-id-not-cached-offline", ["--model", "no-such-org/no-such-model", *FAST], CPU_ONLY, errors.ModelNotCached),
    ("gated-repo", ["--model", "org/gated", *FAST],
     Adapters(cuda_available=lambda: False, download=_raising(_hub_error(GatedRepoError, 401))),
     errors.HubAccessDenied),
    ("token-refused", ["--model", "org/private", *FAST],
     Adapters(cuda_available=lambda: False, download=_raising(_hub_error(HfHubHTTPError, 403))),
     errors.HubAccessDenied),
    ("oom-while-loading", ["--model", "org/huge", *FAST],
     Adapters(cuda_available=lambda: False, download=_downloaded,
              from_pretrained=_raising(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))),
     errors.OutOfMemory),
    ("no-gpu-required", ["--model", "org/any", "--require-gpu", *FAST], CPU_ONLY, errors.NoGPU),
    ("cpu-without-gpu-product", ["--model", "org/any"], CPU_ONLY, errors.InvalidArguments),
    ("cpu-product-not-in-catalog", ["--model", "org/any", "--gpu-product", "NVIDIA B300"], CPU_ONLY,
     errors.InvalidArguments),
    ("bad-out-target", ["--model", "org/any", *FAST, "--out", "s3://bucket"], CPU_ONLY, errors.InvalidArguments),
]


@pytest.mark.parametrize("argv,adapters,error", [f[1:] for f in FAILURES], ids=[f[0] for f in FAILURES])
def test_each_failure_exits_with_its_code_and_one_termination_line(argv, adapters, error, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_AbCdEfGh12345678")
    code, profile, log, stderr = run_profiler(argv, tmp_path, adapters)
    assert code == error.exit_code
    assert profile is None
    assert log.endswith("\n") and log.count("\n") == 1
    assert log.startswith(f"{error.reason}: ")
    assert "hf_AbCdEfGh12345678" not in log + stderr
    failed = json.loads(stderr.strip().splitlines()[-1])
    assert (failed["level"], failed["reason"], failed["message"]) == ("error", error.reason, log.strip())
    assert failed["stage"] == (None if error is errors.InvalidArguments or error is errors.NoGPU else "load")


def test_out_of_memory_while_measuring_names_the_flags_that_shrink_it(tiny_models, tmp_path):
    def load_then_fail_forward(model_id, **kwargs):
        model = AutoModelForCausalLM.from_pretrained(model_id)
        model.forward = _raising(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB"))
        return model

    code, _, log, _ = run_profiler(["--model", str(tiny_models["llama"]), *FAST],
                                   tmp_path, Adapters(cuda_available=lambda: False,
                                                      from_pretrained=load_then_fail_forward))
    assert code == errors.OutOfMemory.exit_code
    assert log.startswith("OutOfMemory: measuring ") and "--context-tokens (a prefill chunk of 32) or --concurrency (1)" in log


def test_encoder_model_is_an_unsupported_architecture(tiny_bert, tmp_path):
    code, _, log, _ = run_profiler(["--model", str(tiny_bert), *FAST], tmp_path)
    assert code == errors.UnsupportedArchitecture.exit_code
    assert log.startswith("UnsupportedArchitecture: BertLMHeadModel has weights outside")


@pytest.mark.parametrize("config,message", [
    ({"model_type": "t5", "d_model": 32, "num_layers": 2, "num_heads": 2, "vocab_size": 64},
     "is a T5Config (t5), not a decoder-only causal LM"),
    ({"model_type": "no-such-architecture"}, "does not know model_type 'no-such-architecture'"),
], ids=["encoder-decoder", "unknown-model-type"])
def test_configs_that_are_not_decoder_only_are_refused_before_loading_weights(config, message, tmp_path):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(config))  # no weights: refused from the config alone
    code, _, log, _ = run_profiler(["--model", str(model_dir), *FAST], tmp_path)
    assert code == errors.UnsupportedArchitecture.exit_code
    assert log.startswith("UnsupportedArchitecture: ") and message in log, log


def test_exit_codes_are_distinct_and_documented():
    codes = [e.exit_code for e in errors.ALL_ERRORS]
    assert len(set(codes)) == len(codes) and errors.INTERNAL_ERROR_EXIT_CODE not in codes
    doc = (REPO_ROOT / "docs" / "profiler.md").read_text()
    for error in errors.ALL_ERRORS:
        assert f"| {error.exit_code} | `{error.reason}` |" in doc, f"{error.reason} missing from docs/profiler.md"


def test_progress_logs_one_json_line_per_stage_without_a_terminal(profiled):
    stderr = profiled("qwen2")[3]
    records = [json.loads(line) for line in stderr.splitlines()]
    assert [r["stage"] for r in records] == list(STAGES)
    assert all(r["event"] == "done" and r["elapsedMs"] >= 0 for r in records)
    assert records[1]["totalBytes"] > 0 and records[2]["bytesPerToken"] == KV_BYTES_PER_TOKEN["qwen2"]


def test_progress_is_a_bar_on_a_terminal(tiny_models, tmp_path):
    code, _, _, stderr = run_profiler(["--model", str(tiny_models["gpt2"]), *FAST], tmp_path, tty=True)
    assert code == 0
    assert f"{len(STAGES)}/{len(STAGES)}" in stderr and "{" not in stderr


def test_python_dash_m_entry_point_exits_with_the_code_and_line(tmp_path):
    log = tmp_path / "termination-log"
    proc = subprocess.run([sys.executable, "-m", "profiler_job", "--model", "org/m", "--out", "nowhere",
                           "--termination-log", str(log)], capture_output=True, text=True, cwd=REPO_ROOT, timeout=60)
    assert proc.returncode == errors.InvalidArguments.exit_code, proc.stderr
    assert log.read_text().startswith("InvalidArguments: --out 'nowhere' is not an output target")


@pytest.mark.gpu
def test_profile_on_a_gpu_is_measured_and_names_the_gpu_as_its_node_label(tiny_models, tmp_path):
    from profiler_job.gpu import normalize_product

    code, profile, log, stderr = run_profiler(["--model", str(tiny_models["llama"]), "--require-gpu",
                                               "--context-tokens", "64", "--repeats", "2"], tmp_path, Adapters())
    assert (code, log) == (0, None), stderr
    assert profile["source"] == "measured"
    assert profile["gpu"]["product"] == normalize_product(torch.cuda.get_device_name())
    assert profile["gpu"]["memoryBytes"] > 0 and profile["gpu"]["driverVersion"]
    assert profile["weights"]["totalBytes"] == parameter_bytes(tiny_models["llama"])
    assert profile["activation"]["prefillBytesPerToken"] > 0 and profile["activation"]["decodeBytesPerSequence"] > 0
    assert profile["layerCopyMs"] > 0 and profile["hostToDeviceGBps"] > 1
    settings = {"gpu", "activation.prefillChunkTokens"}
    assert all(how.startswith("measured") for key, how in profile["derivation"].items() if key not in settings), \
        profile["derivation"]
