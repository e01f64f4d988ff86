"""Plan 10,000 ElasticModels over 1,000 GPU slots; print the time and the peak memory.

Target (issue 2): under 2 s on 2 cores. Inputs: the four estimated H200 profiles
shipped in examples/fleet/profiles (mostly small models, as on a shared cluster), budgets
and contexts drawn from a fixed seed so that every mode occurs. Run: .venv/bin/python bench/plan_scale.py [--models N --slots M]
"""
from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import time
import tracemalloc
from collections import Counter
from pathlib import Path

from controller.inputs.reader import load_repo
from controller.planning.plan import plan
from controller.types import SLO, ElasticModel, GpuSlot, Inputs

FLEET = Path(__file__).resolve().parent.parent / "examples" / "fleet"
GiB = 1 << 30


def shipped_profiles() -> tuple:
    """examples/fleet's profiles of models in their checkpoint's own precision (weight dtype auto): what the
    benches' fleets are made of (the int8 and int4 profiles beside them are for models that ask for those)."""
    return tuple(p for p in load_repo(FLEET).profiles if p.weight_dtype == "auto")


def synthetic_inputs(n_models: int, n_slots: int, seed: int = 7) -> Inputs:
    profiles = tuple(sorted((p for p in shipped_profiles() if p.gpu_product == "NVIDIA-H200"),
                            key=lambda p: p.weight_bytes))
    mix = (0.45, 0.4, 0.12, 0.03)  # 0.5B, 8B, 32B, 70B: mostly small models, as on a shared cluster
    rng = random.Random(seed)
    slots = tuple(GpuSlot(node=f"node-{i // 8:04d}", index=i % 8, product="NVIDIA-H200",
                          memory_bytes=143771 * 2**20) for i in range(n_slots))
    models = []
    for i in range(n_models):
        profile = rng.choices(profiles, weights=mix)[0]
        weights_gib = profile.weight_bytes / GiB
        budget = int(rng.uniform(0.3, 1.6) * weights_gib * GiB) + GiB
        slo = SLO(context_tokens=rng.choice((2048, 4096, 8192)), concurrency=rng.choice((1, 2, 4)),
                  ttft_ms=rng.choice((None, 500.0, 2000.0)), tpot_ms=rng.choice((None, 50.0)))
        models.append(ElasticModel(name=f"m-{i:05d}", namespace=f"team-{i % 50:02d}", model=profile.model,
                                   budget_bytes=budget, slo=slo, gpu_product="NVIDIA-H200"))
    return Inputs(models=tuple(models), profiles=profiles, slots=slots)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=10_000)
    parser.add_argument("--slots", type=int, default=1_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    inputs = synthetic_inputs(args.models, args.slots)

    times, cpu = [], []
    for _ in range(args.repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        result = plan(inputs)
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    tracemalloc.start()
    plan(inputs)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()

    modes = Counter(d.mode for d in result.decisions)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"plan {args.models} models over {args.slots} slots: median {statistics.median(times):.3f} s "
          f"(runs: {', '.join(f'{t:.3f}' for t in times)}); CPU time median {statistics.median(cpu):.3f} s; "
          f"target < 2 s; load average {os.getloadavg()[0]:.1f}")
    print(f"peak memory allocated during one plan: {peak / 2**20:.1f} MiB (tracemalloc)")
    print("modes: " + ", ".join(f"{m} {modes[m]}" for m in ("resident", "swap", "elastic", "refused")))
    codes = Counter(d.reason_code for d in result.decisions if d.mode == "refused")
    print("refused by reason: " + (", ".join(f"{c} {n}" for c, n in sorted(codes.items())) or "none"))


if __name__ == "__main__":
    main()
