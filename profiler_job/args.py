"""Command line of `python -m profiler_job`: parses argv into Options and an output Target.

Owns flag names, defaults and their validation. Called by profiler_job.cli;
bench/profile_gpu.py builds Options directly.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from contract.footprint import PREFILL_CHUNK_TOKENS
from contract.precision import AUTO, WEIGHT_DTYPES
from profiler_job.errors import InvalidArguments
from profiler_job.termination import DEFAULT_TERMINATION_LOG

PROFILE_DTYPES = ("bfloat16", "float16", "float32")  # what a profile's dtype may be
DTYPES = ("auto", *PROFILE_DTYPES)
WEIGHTS = WEIGHT_DTYPES  # --weights: the ElasticModel's spec.weights.dtype (contract.precision)
DEFAULT_CONTEXT_TOKENS = 4096
DEFAULT_CONCURRENCY = 1
DEFAULT_REPEATS = 5


@dataclass(frozen=True)
class ConfigMapTarget:
    namespace: str
    name: str


@dataclass(frozen=True)
class FileTarget:
    path: str


Target = ConfigMapTarget | FileTarget


@dataclass(frozen=True)
class Options:
    model: str
    out: Target | None = None  # None: measure only (bench/profile_gpu.py)
    revision: str = "main"
    dtype: str = "auto"
    context_tokens: int = DEFAULT_CONTEXT_TOKENS
    concurrency: int = DEFAULT_CONCURRENCY  # the ElasticModel's slo.concurrency
    repeats: int = DEFAULT_REPEATS
    gpu_product: str | None = None
    require_gpu: bool = False
    trust_remote_code: bool = False
    termination_log: str = DEFAULT_TERMINATION_LOG
    max_gpu_memory_bytes: int | None = None  # beside running workers: the memory the plan leaves free there
    weights: str = AUTO  # spec.weights.dtype: the decoder linears' dtype the profile is for

    @property
    def chunk_tokens(self) -> int:
        """Tokens in one prefill forward: the context, bounded by the one prefill chunk (contract.footprint)."""
        return min(self.context_tokens, PREFILL_CHUNK_TOKENS)


def parse_target(text: str) -> Target:
    """`configmap:NAMESPACE/NAME` or `file:PATH`."""
    kind, sep, rest = text.partition(":")
    if sep and kind == "file" and rest:
        return FileTarget(rest)
    if sep and kind == "configmap":
        namespace, slash, name = rest.partition("/")
        if slash and namespace and name and "/" not in name:
            return ConfigMapTarget(namespace, name)
    raise InvalidArguments(
        f"--out {text!r} is not an output target; write configmap:NAMESPACE/NAME or file:PATH"
    )


def _positive(text: str) -> int:
    return _at_least(text, 1, "a positive integer")


def _non_negative(text: str) -> int:
    return _at_least(text, 0, "a non-negative integer")


def _at_least(text: str, low: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if value < low:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
    return value


class _Parser(argparse.ArgumentParser):
    """argparse that raises InvalidArguments (exit code, termination line) instead of exiting."""

    def error(self, message: str):
        raise InvalidArguments(f"{message}; run `python -m profiler_job --help` for the flags")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m profiler_job",
                description="Measure a model on this GPU type and publish its profile (schemas/profile.schema.json).")
    p.add_argument("--model", required=True, help="hub id (from the local cache when HF_HUB_OFFLINE=1) or a local path")
    p.add_argument("--revision", default="main", help="hub revision (branch, tag or commit); default main")
    p.add_argument("--dtype", choices=DTYPES, default="auto",
                   help="the compute dtype; auto: the checkpoint's, float16 for bfloat16 on a GPU without bfloat16")
    p.add_argument("--weights", choices=WEIGHTS, default=AUTO,
                   help="the ElasticModel's spec.weights.dtype: int8 or int4 quantize the decoder linears as the "
                        "worker does (engine/quantize.py); auto: the checkpoint's own precision")
    p.add_argument("--context-tokens", type=_positive, default=DEFAULT_CONTEXT_TOKENS,
                   help=f"prompt length the prefill is measured for (default {DEFAULT_CONTEXT_TOKENS})")
    p.add_argument("--concurrency", "--batch", dest="concurrency", type=_positive, default=DEFAULT_CONCURRENCY,
                   help="the model's declared concurrency (slo.concurrency): decode is measured at batch 1, the "
                        "powers of two below it and at it, and the decode activation peak at it (default 1)")
    p.add_argument("--repeats", type=_positive, default=DEFAULT_REPEATS, help="timed runs per latency (median)")
    p.add_argument("--gpu-product", help="label the profile with this nvidia.com/gpu.product (CPU runs; overrides NVML)")
    p.add_argument("--require-gpu", action="store_true", help="fail with NoGPU when no CUDA device is visible")
    p.add_argument("--trust-remote-code", action="store_true", help="run the model repository's own code (off by default)")
    p.add_argument("--max-gpu-memory-mib", type=_non_negative, metavar="MIB",
                   help="use at most this much GPU memory (beside running workers: what they leave free); the "
                        "free memory the driver reports bounds it too")
    p.add_argument("--out", required=True, type=str, help="configmap:NAMESPACE/NAME or file:PATH")
    p.add_argument("--termination-log", default=DEFAULT_TERMINATION_LOG,
                   help=f"file for the one-line failure message (default {DEFAULT_TERMINATION_LOG})")
    return p


def parse_args(argv: list[str]) -> Options:
    ns = build_parser().parse_args(argv)
    return Options(
        model=ns.model, out=parse_target(ns.out), revision=ns.revision, dtype=ns.dtype,
        context_tokens=ns.context_tokens, concurrency=ns.concurrency,
        repeats=ns.repeats, gpu_product=ns.gpu_product, require_gpu=ns.require_gpu,
        trust_remote_code=ns.trust_remote_code, termination_log=ns.termination_log,
        max_gpu_memory_bytes=None if ns.max_gpu_memory_mib is None else ns.max_gpu_memory_mib << 20,
        weights=ns.weights,
    )


def termination_log_from(argv: list[str]) -> str:
    """The --termination-log value even when the rest of argv does not parse (so that failure is reported)."""
    for i, arg in enumerate(argv):
        if arg == "--termination-log" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--termination-log="):
            return arg.split("=", 1)[1]
    return DEFAULT_TERMINATION_LOG
