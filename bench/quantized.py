"""Weight dtypes through the worker's engine: the bytes an elastic model streams per token, and decode time.

    python bench/quantized.py                      # CPU: a 4-layer Llama-shaped model (hidden 1024)
    python bench/quantized.py --device cuda        # GPU: 8 decoder layers of the Llama-3.1-8B shape

For bfloat16, int8 and int4 weights (engine/quantize.py; int4 only where contract.precision lets the device
run it) of one random-weight model, each placed by the worker's residency modes and stepped by its engine:
- the decoder weight bytes, and the bytes an elastic model with every layer streamed copies host→device per
  decode token (the residency's streamed-bytes counter: each layer's packed tensors once per step), against
  bfloat16's (targets: int8 <= 0.51, int4 <= 0.30);
- resident decode ms/token at batch 1 (median of the steps), against bfloat16's (on a GPU the int8 ÷ bfloat16
  figure is the one bench/gpu_run.sh records; no target: it says what the dequantizing kernels cost);
- the elastic decode step against its PCIe floor: the streamed bytes ÷ the measured pinned host→device copy
  rate (on a GPU; target <= 1.2x, as bench/worker_gpu.py's bfloat16 elastic row).
Exit status 1 when a target is missed. CPU timings are noisy on a shared machine.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SHAPES = {
    "llama-8b": dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                     vocab_size=128256),
    "small": dict(hidden_size=1024, intermediate_size=2816, num_attention_heads=16, num_key_value_heads=4,
                  vocab_size=32000),
}
BYTES_TARGET = {"int8": 0.51, "int4": 0.30}
FLOOR_TARGET = 1.2


def build(shape: dict, layers: int, weights: str, device):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from engine.quantize import quantize_decoder

    torch.manual_seed(0)
    config = LlamaConfig(num_hidden_layers=layers, max_position_embeddings=4096, **shape)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    if weights != "bfloat16":
        quantize_decoder(model, weights, device)
    return model


def engine_for(model, mode: str, device):
    from engine.batch import ModelEngine
    from engine.memory import DeviceLedger
    from engine.residency import make_residency

    residency = make_residency(mode, model, DeviceLedger("bench", 1 << 40, device), device, resident_layers=0)
    streamed: list[int] = []
    residency.on_streamed_bytes = streamed.append
    residency.load()
    return ModelEngine(residency, concurrency=1, context_tokens=512, kv_bytes=0), streamed


def step_ms(engine, device, steps: int, streamed: list[int] | None = None) -> tuple[float, float]:
    """(median ms of `steps` decode steps at batch 1, bytes `streamed` records per timed step)."""
    import torch

    from engine.batch import Generation
    from engine.sampling import SamplingParams

    sequence = Generation(prompt_ids=list(range(1, 17)), params=SamplingParams(max_tokens=steps + 4, temperature=0),
                          eos_ids=frozenset(), decode=lambda ids: "")
    engine.join(sequence)
    while sequence.prefilling or len(sequence.output_ids) < 2:
        engine.step()
    mark = sum(streamed or ())
    times = []
    for _ in range(steps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        engine.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - started) * 1000)
    moved = (sum(streamed or ()) - mark) / steps  # steady state: each step streams every layer once
    engine.deactivate()
    return statistics.median(times), moved


def pinned_gbps(device, nbytes: int = 256 << 20) -> float:
    """The host→device copy rate of pinned memory (GB/s), the link elastic streaming is bound by."""
    import torch

    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=device.type == "cuda")
    target = torch.empty(nbytes, dtype=torch.uint8, device=device)
    target.copy_(host, non_blocking=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(5):
        target.copy_(host, non_blocking=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return 5 * nbytes / (time.perf_counter() - started) / 1e9


def decoder_bytes(model) -> int:
    from engine.residency import decoder_layers

    return sum(t.numel() * t.element_size() for layer in decoder_layers(model) for t in layer.state_dict().values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--shape", choices=sorted(SHAPES), default=None, help="default: small on CPU, llama-8b on CUDA")
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (default: 4 on CPU, 8 on CUDA)")
    parser.add_argument("--steps", type=int, default=8, help="timed decode steps per figure")
    args = parser.parse_args(argv)

    import torch

    from contract.precision import capability_problem
    from engine.quantize import device_capability

    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench/quantized.py --device cuda needs a CUDA device", file=sys.stderr)
        return 2
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    shape = SHAPES[args.shape or ("llama-8b" if device.type == "cuda" else "small")]
    layers = args.layers or (8 if device.type == "cuda" else 4)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{platform.machine()} CPU, " \
        f"{os.cpu_count()} cores, {torch.get_num_threads()} intra-op threads"
    print(f"machine: {where}; torch {torch.__version__}; {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; "
          f"Llama shape hidden {shape['hidden_size']}, {layers} layers")
    link = pinned_gbps(device)
    rows, missed = {}, []
    for weights in ("bfloat16", "int8", "int4"):
        if capability_problem(device_capability(device), weights):
            print(f"{weights}: not run ({capability_problem(device_capability(device), weights)[0]})")
            continue
        resident, _ = engine_for(build(shape, layers, weights, device), "resident", device)
        resident_ms, _ = step_ms(resident, device, args.steps)
        model = build(shape, layers, weights, device)
        held = decoder_bytes(model)
        elastic, streamed = engine_for(model, "elastic", device)
        elastic_ms, per_token = step_ms(elastic, device, args.steps, streamed)
        rows[weights] = (held, per_token, resident_ms, elastic_ms)
    base = rows["bfloat16"]
    print(f"{'weights':<9} {'decoder bytes':>14} {'streamed B/token':>17} {'÷ bf16':>7} {'resident ms/tok':>16} "
          f"{'÷ bf16':>7} {'elastic ms/step':>16} {'PCIe floor ms':>14} {'÷ floor':>8}")
    for weights, (held, per_token, resident_ms, elastic_ms) in rows.items():
        floor = per_token / (link * 1e9) * 1000
        ratio = per_token / base[1]
        print(f"{weights:<9} {held:>14} {per_token:>17.0f} {ratio:>7.3f} {resident_ms:>16.3f} "
              f"{resident_ms / base[2]:>7.2f} {elastic_ms:>16.3f} {floor:>14.3f} {elastic_ms / floor:>8.2f}")
        if weights in BYTES_TARGET and ratio > BYTES_TARGET[weights]:
            missed.append(f"{weights}-bytes")
        if device.type == "cuda" and elastic_ms / floor > FLOOR_TARGET:
            missed.append(f"{weights}-floor")
    print(f"pinned host→device copy: {link:.1f} GB/s; targets: streamed bytes int8 <= {BYTES_TARGET['int8']}, "
          f"int4 <= {BYTES_TARGET['int4']} of bfloat16's" + (f"; elastic step <= {FLOOR_TARGET}x its PCIe floor"
                                                            if device.type == "cuda" else ""))
    print(f"missed: {missed}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
