"""Profile a model on a GPU; print the time it took and predicted vs measured peak memory.

Targets (issue 4): an 8B model profiled in at most 60 s; the planner's predicted
peak (controller.planning.cost.need: weights + KV for context x concurrency + activation
peak + runtime overhead) within +-5 % of torch.cuda.max_memory_allocated during a
real chunked prefill of every sequence followed by decode steps at that
concurrency. The default model is Llama-3.1-8B-shaped with random weights, built
on the GPU from its published config (contract.estimate.PUBLISHED_CONFIGS),
since weights cannot be downloaded here; --model PATH profiles a local
checkpoint through the Job's own loader instead.

Run on a GPU: .venv/bin/python bench/profile_gpu.py [--model PATH] [--context-tokens 4096 --concurrency 4]
Exits 2 without CUDA, 1 when a target is missed.
"""
from __future__ import annotations

import argparse
import gc
import sys
import time

PUBLISHED = "meta-llama/Llama-3.1-8B-Instruct"
PROFILE_SECONDS_TARGET = 60.0
PEAK_TOLERANCE = 0.05


def build_random_model(dtype: str):
    """The published config of PUBLISHED with random weights, created directly on the GPU."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from contract.estimate import PUBLISHED_CONFIGS

    fields = dict(PUBLISHED_CONFIGS[PUBLISHED])
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    with torch.device("cuda"):
        return AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype)).eval()


def measured_peak(model, context_tokens: int, concurrency: int, chunk_tokens: int, decode_steps: int) -> int:
    """Peak bytes allocated while `concurrency` sequences prefill `context_tokens` each, `chunk_tokens`
    tokens per forward in all, then decode `decode_steps` tokens together."""
    import torch

    from profiler_job.measure.device import Device, forward, next_tokens

    device = Device("cuda")
    per_sequence = max(1, chunk_tokens // concurrency)
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    out, done = None, 0
    while done < context_tokens:
        step = min(per_sequence, context_tokens - done)
        out = forward(model, device.tokens(model.config.vocab_size, concurrency, step, seed=done),
                      None if out is None else out.cache)
        done += step
    for _ in range(decode_steps):
        out = forward(model, next_tokens(out), out.cache)
    device.sync()
    return torch.cuda.max_memory_allocated()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="local checkpoint; default: Llama-3.1-8B-shaped random weights")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    p.add_argument("--context-tokens", type=int, default=4096)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--decode-steps", type=int, default=32)
    args = p.parse_args(argv)

    import torch
    if not torch.cuda.is_available():
        print("profile_gpu: no CUDA device is visible; this benchmark measures GPU memory and time, "
              "run it on a GPU node", file=sys.stderr)
        return 2

    from controller.planning.cost import need
    from controller.inputs.load import parse_profile
    from controller.types import SLO
    from profiler_job.args import Options
    from profiler_job.gpu import current_identity
    from profiler_job.load import load_model
    from profiler_job.measure.device import Device
    from profiler_job.progress import Progress
    from profiler_job.run import measure_model

    options = Options(model=args.model or f"{PUBLISHED} (shape, random weights)",
                      dtype=args.dtype, context_tokens=args.context_tokens, batch=args.concurrency)
    identity = current_identity(None)
    start = time.perf_counter()
    if args.model:
        model = load_model(args.model, revision="main", dtype=args.dtype, trust_remote_code=False, device="cuda")
    else:
        model = build_random_model(args.dtype)
    loaded = time.perf_counter()
    doc = measure_model(model, options, Device("cuda"), identity, Progress(sys.stderr, tty=False))
    profiled = time.perf_counter()

    profile, errors = parse_profile(doc, "bench")
    if profile is None:
        print(f"profile_gpu: the profile does not load: {errors}", file=sys.stderr)
        return 1
    slo = SLO(context_tokens=args.context_tokens, concurrency=args.concurrency)
    predicted = need(profile, slo)
    measured = measured_peak(model, args.context_tokens, args.concurrency, profile.prefill_chunk_tokens,
                             args.decode_steps)
    ratio = predicted.total / measured
    profile_s = profiled - loaded
    load_s = loaded - start

    print(f"model: {options.model}, {args.dtype}, on {identity.product} (torch {torch.__version__})")
    print(f"load/build: {load_s:.1f} s; profile: {profile_s:.1f} s; total: {load_s + profile_s:.1f} s "
          f"(target <= {PROFILE_SECONDS_TARGET:.0f} s for load + profile)")
    print(f"predicted peak: weights {predicted.weights} + KV {predicted.kv_cache} "
          f"({args.context_tokens} tokens x {args.concurrency}) + activation {predicted.activation} "
          f"+ overhead {predicted.overhead} = {predicted.total} bytes")
    print(f"measured peak: {measured} bytes (torch.cuda.max_memory_allocated: chunked prefill of "
          f"{args.context_tokens} tokens x {args.concurrency} sequences, {profile.prefill_chunk_tokens} tokens per "
          f"forward, then {args.decode_steps} decode steps)")
    print(f"predicted / measured: {ratio:.4f} (target {1 - PEAK_TOLERANCE:.2f}..{1 + PEAK_TOLERANCE:.2f})")
    print(f"profile: decode {profile.decode_ms_per_token:.2f} ms/token, prefill {profile.prefill_ms_per_1k_tokens:.1f} "
          f"ms/1k tokens, host->device {profile.host_to_device_gbps:.1f} GB/s, source {profile.source}")
    met = load_s + profile_s <= PROFILE_SECONDS_TARGET and abs(ratio - 1) <= PEAK_TOLERANCE
    print("targets: met" if met else "targets: MISSED")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
