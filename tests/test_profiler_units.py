"""Pure parts of the profiler Job: flags, output targets, GPU names, redaction, the CPU activation estimate."""
from __future__ import annotations

import pytest

from contract.footprint import PREFILL_CHUNK_TOKENS
from profiler_job import errors
from profiler_job.args import ConfigMapTarget, FileTarget, parse_args, parse_target, termination_log_from
from profiler_job.gpu import cuda_version_text, normalize_product
from profiler_job.termination import MAX_MESSAGE_BYTES, one_line, redact, write_termination_line


@pytest.mark.parametrize("text,target", [
    ("configmap:llm/profile-qwen", ConfigMapTarget("llm", "profile-qwen")),
    ("file:/tmp/p.yaml", FileTarget("/tmp/p.yaml")),
    ("file:relative/p.yaml", FileTarget("relative/p.yaml")),
], ids=["configmap", "file-absolute", "file-relative"])
def test_output_targets_parse(text, target):
    assert parse_target(text) == target


@pytest.mark.parametrize("text", ["configmap:llm", "configmap:/name", "configmap:ns/a/b", "file:", "s3://b/p", "p.yaml"],
                         ids=["no-name", "no-namespace", "extra-slash", "empty-path", "unknown-scheme", "bare-path"])
def test_bad_output_targets_say_the_accepted_forms(text):
    with pytest.raises(errors.InvalidArguments, match="configmap:NAMESPACE/NAME or file:PATH"):
        parse_target(text)


def test_flags_parse_with_defaults_and_chunk_bounded_by_context():
    options = parse_args(["--model", "org/m", "--out", "file:p.yaml", "--context-tokens", "300"])
    assert (options.revision, options.dtype, options.batch, options.trust_remote_code) == ("main", "auto", 1, False)
    assert options.chunk_tokens == 300
    assert parse_args(["--model", "m", "--out", "file:p", "--context-tokens", "8192"]).chunk_tokens == PREFILL_CHUNK_TOKENS


@pytest.mark.parametrize("argv", [["--out", "file:p"], ["--model", "m", "--out", "file:p", "--batch", "0"],
                                  ["--model", "m", "--out", "file:p", "--dtype", "int8"]],
                         ids=["model-missing", "batch-zero", "dtype-unknown"])
def test_bad_flags_are_invalid_arguments(argv):
    with pytest.raises(errors.InvalidArguments, match="python -m profiler_job --help"):
        parse_args(argv)


def test_termination_log_is_found_even_when_other_flags_are_bad():
    assert termination_log_from(["--batch", "x", "--termination-log", "/t/log"]) == "/t/log"
    assert termination_log_from(["--termination-log=/t/log2"]) == "/t/log2"
    assert termination_log_from([]) == "/dev/termination-log"


@pytest.mark.parametrize("nvml,label", [
    ("NVIDIA H200", "NVIDIA-H200"),
    ("Tesla T4", "Tesla-T4"),
    ("NVIDIA A100-SXM4-80GB", "NVIDIA-A100-SXM4-80GB"),
    ("NVIDIA GeForce RTX 4090", "NVIDIA-GeForce-RTX-4090"),
    ("NVIDIA-H200", "NVIDIA-H200"),
    ("NVIDIA RTX 6000 Ada Generation (x)", "NVIDIA-RTX-6000-Ada-Generation--x"),
], ids=["h200", "t4", "a100-sxm", "geforce", "already-a-label", "parentheses"])
def test_product_names_normalize_like_gpu_feature_discovery(nvml, label):
    assert normalize_product(nvml) == label


def test_product_name_without_label_characters_is_refused():
    with pytest.raises(errors.InvalidArguments, match="--gpu-product"):
        normalize_product("   ")


@pytest.mark.parametrize("version,text", [(12040, "12.4"), (12090, "12.9"), (11080, "11.8"), (13000, "13.0")])
def test_cuda_driver_version_text(version, text):
    assert cuda_version_text(version) == text


def test_redaction_removes_token_values_and_token_shapes():
    env = {"HF_TOKEN": "secret-value-1234", "HUGGING_FACE_HUB_TOKEN": "other-secret"}
    text = "401 with secret-value-1234 and other-secret and hf_ZyXwVuTs98765432"
    assert redact(text, env) == "401 with [REDACTED] and [REDACTED] and [REDACTED]"


def test_termination_line_is_one_line_within_the_kubernetes_limit(tmp_path):
    assert one_line("ModelNotFound: a\nb\tc") == "ModelNotFound: a b c"
    long = one_line("X: " + "é" * MAX_MESSAGE_BYTES)
    assert len(long.encode()) <= MAX_MESSAGE_BYTES and long.endswith("...")
    path = tmp_path / "log"
    assert write_termination_line(path, "NoGPU: none\nvisible") == "NoGPU: none visible"
    assert path.read_text() == "NoGPU: none visible\n"
    write_termination_line(tmp_path / "missing-dir" / "log", "NoGPU: x")  # outside a Pod: no error
