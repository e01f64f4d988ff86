"""How close the planner comes to the best plan, and how much it moves models when the fleet changes.

Three experiments (issue 11), every number printed:
1. Small fleets: at least 400 seeded random fleets of 2-8 models (the four catalog shapes, random budgets,
   contexts, concurrency and SLOs) on 1-3 slots of H200/L4/T4, half pinned to a product. Each is solved
   exactly (controller.plan_exact, CP-SAT) and by the fleet-scale greedy; prints how often the greedy
   matches the optimum on each criterion in order (refused; then elastic; then swap; then total predicted
   TPOT) and the total refusals of each. `plan()` itself solves instances this small exactly.
2. The 10,000-model / 1,000-H200 fleet of bench/plan_scale.py: refusals beside the floor (models whose
   budget is below their elastic minimum, which no plan can place).
3. Mixed fleets (issue 23): seeded fleets of 2-4 GPUs mixing H200, L4 and A100 (A100 profiles estimated here),
   3-7 models with TPOT/TTFT targets, half without a product. Prints the SLO targets predicted met by plan()
   and by the greedy against the reference: the exact solver with SLO misses ranked right after refused (the
   best plan with the same refusals); on how many fleets each meets as many with the same refusals; how
   often it refuses a model the reference serves; and on how many fleets it refuses a model that a GPU of
   another product could take as the plan leaves it (issue 23: never).
4. Churn: 200 models with previous decisions passed in, on a loaded fleet and with 10 spare GPUs: add one
   model, remove one, raise one budget; the distribution of other models moved (slot, mode or layers
   changed), and the same without previous decisions for comparison.
5. The greedy regime's refusals against the exact search, by size (issue 33): seeded fleets of N models on M
   GPUs of one product, from 4 models on 2 GPUs up to the exact regime's limit (10 models, 40 pairs) and the
   issue's shape beyond it (9 models on 5 GPUs: plan() is greedy there, the exact search is forced), and
   random fleets of the issue's own kind (five NVIDIA-L4 with 64 GiB per node; three 8B, five 32B, one 70B,
   every model with a TPOT target). Prints, per size, the refusals of each and on how many fleets the greedy
   refuses more or fewer, and the seconds per fleet of each.
Run: .venv/bin/python bench/plan_quality.py [--fleets 400 --mixed 100 --trials 40 --sized 40 --issue 30]
"""
from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.plan_scale import shipped_profiles, synthetic_inputs  # noqa: E402
from contract.estimate import (PUBLISHED_CONFIGS, architecture_from_config, config_source,  # noqa: E402
                               estimate_profile)
from contract.gpu_catalog import GpuSpec  # noqa: E402
from controller.inputs.load import parse_profile  # noqa: E402
from controller.planning.cost import missed  # noqa: E402
from controller.planning.plan import EXACT_MAX_MODELS, EXACT_MAX_PAIRS, plan  # noqa: E402
from controller.types import SLO, ElasticModel, GpuSlot, Inputs  # noqa: E402

PRODUCTS = {"NVIDIA-H200": 143771, "NVIDIA-L4": 23034, "Tesla-T4": 15360}  # MiB per GPU
GiB = 1 << 30


def small_fleet(rng: random.Random, profiles, pinned: bool) -> Inputs:
    n_slots = rng.randint(1, 3)
    slots = []
    for i in range(n_slots):
        product = rng.choice(sorted(PRODUCTS))
        slots.append(GpuSlot(node=f"node-{i}", index=0, product=product, memory_bytes=PRODUCTS[product] * 2**20,
                             host_memory_bytes=rng.choice((None, 256 * GiB, 64 * GiB))))
    present = sorted({s.product for s in slots})
    models = []
    for i in range(rng.randint(2, 8)):
        model_id = rng.choice(sorted({p.model for p in profiles}))
        product = rng.choice(present) if pinned else None
        ref = next(p for p in profiles if p.model == model_id and p.gpu_product == (product or present[0]))
        budget = int(rng.uniform(0.2, 1.5) * ref.weight_bytes) + GiB
        slo = SLO(context_tokens=rng.choice((1024, 4096, 8192)), concurrency=rng.choice((1, 2, 4)),
                  ttft_ms=rng.choice((None, None, 1000.0, 10000.0)), tpot_ms=rng.choice((None, 50.0, 200.0)))
        models.append(ElasticModel(name=f"m{i}", namespace="bench", model=model_id, budget_bytes=budget, slo=slo,
                                   gpu_product=product, has_slo=True))
    return Inputs(models=tuple(models), profiles=profiles, slots=tuple(slots))


def criteria(result) -> tuple:
    modes = [d.mode for d in result.decisions]
    tpot = sum(d.predicted.tpot_ms for d in result.decisions if d.predicted is not None)
    return (modes.count("refused"), modes.count("elastic"), modes.count("swap"), tpot)


def small_fleets(n: int, seed: int) -> None:
    profiles = shipped_profiles()
    rng = random.Random(seed)
    names = ("refused", "+ elastic", "+ swap", "+ total TPOT (within 0.1 %)")
    for pinned in (True, False):
        matches = [0, 0, 0, 0]
        totals = {"exact": 0, "greedy": 0}
        fewer = 0
        started = time.perf_counter()
        for _ in range(n // 2):
            inputs = small_fleet(rng, profiles, pinned)
            best, greedy = criteria(plan(inputs, method="exact")), criteria(plan(inputs, method="greedy"))
            totals["exact"] += best[0]
            totals["greedy"] += greedy[0]
            fewer += greedy[0] < best[0]
            for k in range(4):
                same = greedy[:min(k + 1, 3)] == best[:min(k + 1, 3)]
                if k == 3:
                    same = same and greedy[3] <= best[3] * 1.001 + 1e-9
                matches[k] += same
        took = time.perf_counter() - started
        print(f"small fleets, {'pinned to a product' if pinned else 'unpinned'}: {n // 2} fleets in {took:.1f} s")
        for name, count in zip(names, matches):
            print(f"  greedy equals the exact optimum on {name:<28} {count / (n // 2):6.1%} ({count}/{n // 2})")
        print(f"  refusals: exact {totals['exact']}, greedy {totals['greedy']}; fleets where the greedy refuses "
              f"fewer: {fewer}; plan() uses the exact solver at this size")


# NVIDIA A100 80GB (SXM) datasheet: 80 GB HBM2e, 2,039 GB/s, BF16 tensor 312 TFLOPS dense; PCIe Gen4 x16 host link.
# Bench-only: gpushare ships no A100 profiles (contract.gpu_catalog), so its profiles are estimated here.
A100 = GpuSpec(product="NVIDIA-A100-SXM4-80GB", memory_bytes=81920 * 2**20, hbm_gbps=2039.0, dense_half_tflops=312.0,
               half_dtype="bfloat16", pcie="PCIe Gen4 x16 (31.5 GB/s per direction)", pinned_h2d_gbps=25.0,
               datasheet="NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB)")
MIXED = {"NVIDIA-H200": 143771, "NVIDIA-L4": 23034, A100.product: 81920}  # MiB per GPU


def mixed_profiles() -> tuple:
    """The shipped H200 and L4 profiles and the same four models estimated on an A100."""
    shipped = tuple(p for p in shipped_profiles() if p.gpu_product in MIXED)
    a100 = []
    for model_id, config in sorted(PUBLISHED_CONFIGS.items()):
        doc = estimate_profile(architecture_from_config(config, source=config_source(model_id)), model_id, A100)
        profile, errors = parse_profile(doc, f"estimated/{model_id}@{A100.product}")
        assert profile is not None, errors
        a100.append(profile)
    return shipped + tuple(a100)


def mixed_fleet(rng: random.Random, profiles) -> Inputs:
    """2-4 GPUs of H200, L4 and A100; 3-7 models with TPOT/TTFT targets, half without a product."""
    slots = tuple(GpuSlot(node=f"node-{i}", index=0, product=product, memory_bytes=MIXED[product] * 2**20,
                          host_memory_bytes=256 * GiB)
                  for i, product in enumerate(rng.choice(sorted(MIXED)) for _ in range(rng.randint(2, 4))))
    present = sorted({s.product for s in slots})
    models = []
    for i in range(rng.randint(3, 7)):
        model_id = rng.choice(sorted({p.model for p in profiles}))
        product = rng.choice(present) if rng.random() < 0.5 else None
        ref = next(p for p in profiles if p.model == model_id and p.gpu_product == "NVIDIA-H200")
        slo = SLO(context_tokens=rng.choice((1024, 4096)), concurrency=rng.choice((1, 2, 4)),
                  ttft_ms=rng.choice((None, 500.0, 2000.0)), tpot_ms=rng.choice((None, 15.0, 30.0, 60.0)))
        models.append(ElasticModel(name=f"m{i}", namespace="bench", model=model_id,
                                   budget_bytes=int(rng.uniform(0.5, 1.5) * ref.weight_bytes) + GiB, slo=slo,
                                   gpu_product=product, has_slo=True))
    return Inputs(models=tuple(models), profiles=profiles, slots=slots)


def slo_score(inputs: Inputs, result) -> tuple[int, int, set]:
    """(refused, SLO targets predicted met, refused models): a refused model meets none of its targets."""
    slos = {m.key: m.slo for m in inputs.models}
    met = 0
    for d in result.decisions:
        if d.predicted is not None:
            met += sum(1 for t in ("ttft", "tpot") if getattr(slos[d.key], f"{t}_ms") is not None
                       and t not in missed(slos[d.key], d.predicted))
    refused = {d.key for d in result.decisions if d.mode == "refused"}
    return len(refused), met, refused


def mixed_fleets(n: int, seed: int) -> None:
    profiles = mixed_profiles()
    rng = random.Random(seed)
    totals = {"targets": 0, "plan": 0, "greedy": 0, "reference": 0}
    equal = {"plan": 0, "greedy": 0}
    same_refusals = {"plan": 0, "greedy": 0}
    other_product = {"plan": 0, "greedy": 0}
    servable = {"plan": 0, "greedy": 0}
    started = time.perf_counter()
    for _ in range(n):
        inputs = mixed_fleet(rng, profiles)
        totals["targets"] += sum((m.slo.ttft_ms is not None) + (m.slo.tpot_ms is not None) for m in inputs.models)
        reference = slo_score(inputs, plan(inputs, method="slo-first"))
        totals["reference"] += reference[1]
        placed_by_reference = {d.key: d.gpu_product for d in plan(inputs, method="slo-first").decisions
                               if d.mode != "refused"}
        for name, method in (("plan", "auto"), ("greedy", "greedy")):
            result = plan(inputs, method=method)
            score = slo_score(inputs, result)
            totals[name] += score[1]
            same_refusals[name] += score[0] == reference[0]
            equal[name] += score[0] == reference[0] and score[1] >= reference[1]
            pinned = {m.key for m in inputs.models if m.gpu_product is not None}
            other_product[name] += sum(1 for key in score[2] if key not in pinned and key in placed_by_reference)
            servable[name] += bool(servable_elsewhere(inputs, result))
    took = time.perf_counter() - started
    print(f"mixed fleets (H200, L4, A100; SLOs; half without a product): {n} fleets in {took:.1f} s; "
          f"{totals['targets']} SLO targets")
    print(f"  reference (exact, SLO misses right after refused): {totals['reference']} targets met")
    for name in ("plan", "greedy"):
        print(f"  {name + '()' if name == 'plan' else 'greedy':<8} {totals[name]} targets met; same refusals as the "
              f"reference on {same_refusals[name]}/{n}; as many targets met with the same refusals on "
              f"{equal[name]}/{n} ({equal[name] / max(n, 1):.1%}); refused while the reference served it on another "
              f"product or GPU: {other_product[name]}; fleets with a model refused while a GPU of another product "
              f"it may run on could take it, the plan left as it is: {servable[name]}/{n}")


def servable_elsewhere(inputs: Inputs, result) -> list[tuple[str, str]]:
    """Refused models (without a product of their own) that a GPU of another product could serve as the plan
    leaves it: re-planned with the plan's decisions as the last ones and the model pinned to that product, it
    is placed and no other model changes slot, mode or slice. (model, product) for each."""
    decisions = {d.key: d for d in result.decisions}
    products = {s.product for s in inputs.slots}
    out = []
    for model in inputs.models:
        refused = decisions[model.key]
        if model.gpu_product is not None or refused.mode != "refused":
            continue
        for product in sorted(products - {refused.gpu_product}):
            if not any(p.key == model.profile_key(product) for p in inputs.profiles):
                continue
            pinned = replace(model, gpu_product=product)
            again = plan(replace(inputs, models=tuple(pinned if m.key == model.key else m for m in inputs.models)),
                         decisions)
            after = {d.key: d for d in again.decisions}
            if after[model.key].mode != "refused" and all(
                    (after[k].slot, after[k].mode, after[k].resident_layers) == (d.slot, d.mode, d.resident_layers)
                    for k, d in decisions.items() if k != model.key):
                out.append((model.name, product))
    return out


SIZES = ((4, 2), (6, 3), (8, 4), (10, 4), (9, 5))  # (models, GPUs): the exact regime's sizes, then the issue's


def sized_fleet(rng: random.Random, profiles, models: int, gpus: int) -> Inputs:
    """`models` models pinned to one product, on `gpus` GPUs of it (one per node, host RAM random)."""
    product = rng.choice(sorted(PRODUCTS))
    host = rng.choice((None, 256 * GiB, 64 * GiB))
    slots = tuple(GpuSlot(node=f"node-{i}", index=0, product=product, memory_bytes=PRODUCTS[product] * 2**20,
                          host_memory_bytes=host) for i in range(gpus))
    catalog = sorted({p.model for p in profiles if p.gpu_product == product})
    out = []
    for i in range(models):
        model_id = rng.choice(catalog)
        ref = next(p for p in profiles if p.model == model_id and p.gpu_product == product)
        slo = SLO(context_tokens=rng.choice((1024, 4096, 8192)), concurrency=rng.choice((1, 2, 4)),
                  ttft_ms=rng.choice((None, None, 1000.0, 10000.0)), tpot_ms=rng.choice((None, 50.0, 200.0, 3000.0)))
        out.append(ElasticModel(name=f"m{i}", namespace="bench", model=ref.model, slo=slo, gpu_product=product,
                                budget_bytes=int(rng.uniform(0.2, 1.5) * ref.weight_bytes) + GiB, has_slo=True))
    return Inputs(models=tuple(out), profiles=profiles, slots=slots)


ISSUE_MODELS = (("meta-llama/Llama-3.1-8B-Instruct", 3), ("Qwen/Qwen2.5-32B-Instruct", 5),
                ("meta-llama/Llama-3.1-70B-Instruct", 1))


def issue_fleet(rng: random.Random, profiles) -> Inputs:
    """Issue 33's kind: five NVIDIA-L4, one per node with 64 GiB; three 8B, five 32B and one 70B, each with a TPOT
    target (budgets, contexts, concurrency and targets drawn per model)."""
    slots = tuple(GpuSlot(node=f"l4-{i}", index=0, product="NVIDIA-L4", memory_bytes=PRODUCTS["NVIDIA-L4"] * 2**20,
                          host_memory_bytes=64 * GiB) for i in range(5))
    out = []
    for model_id, count in ISSUE_MODELS:
        ref = next(p for p in profiles if p.model == model_id and p.gpu_product == "NVIDIA-L4")
        for _ in range(count):
            slo = SLO(context_tokens=rng.choice((256, 512, 1024, 4096)), concurrency=rng.choice((1, 2)),
                      ttft_ms=rng.choice((None, None, 3000.0)),
                      tpot_ms=rng.choice((150.0, 1000.0, 2000.0, 3000.0, 6000.0, 10000.0)))
            budget = rng.choice((8, 12, 16, 24)) * GiB
            out.append(ElasticModel(name=f"m{len(out)}", namespace="bench", model=model_id, slo=slo,
                                    gpu_product="NVIDIA-L4", budget_bytes=budget, has_slo=True))
    return Inputs(models=tuple(out), profiles=profiles, slots=slots)


def against_exact(per_size: int, issue: int, seed: int) -> None:
    profiles = shipped_profiles()
    rng = random.Random(seed)
    kinds = [(f"{m} models on {g} GPUs", lambda m=m, g=g: sized_fleet(rng, profiles, m, g), per_size, m, g)
             for m, g in SIZES]
    kinds.append(("the issue's kind, 9 models on 5 L4", lambda: issue_fleet(rng, profiles), issue, 9, 5))
    print("the greedy regime's refusals against the exact search, by size (plan() is exact up to "
          f"{EXACT_MAX_MODELS} models and {EXACT_MAX_PAIRS} pairs per product, greedy beyond)")
    for label, make, count, models, gpus in kinds:
        if count <= 0:
            continue
        totals = {"exact": 0, "greedy": 0, "more": 0, "fewer": 0}
        seconds = {"exact": 0.0, "greedy": 0.0}
        for _ in range(count):
            inputs = make()
            refused = {}
            for method in ("exact", "greedy"):
                started = time.perf_counter()
                refused[method] = sum(d.mode == "refused" for d in plan(inputs, method=method).decisions)
                seconds[method] += time.perf_counter() - started
                totals[method] += refused[method]
            totals["more"] += refused["greedy"] > refused["exact"]
            totals["fewer"] += refused["greedy"] < refused["exact"]
        regime = "exact" if models <= EXACT_MAX_MODELS and models * gpus <= EXACT_MAX_PAIRS else "greedy"
        print(f"  {label} (plan() is {regime} here): {count} fleets; refused: exact {totals['exact']}, greedy "
              f"{totals['greedy']}; the greedy refuses more on {totals['more']}, fewer on {totals['fewer']}; "
              f"{seconds['exact'] / count:.2f} s exact, {seconds['greedy'] / count:.3f} s greedy per fleet")


def at_scale() -> None:
    inputs = synthetic_inputs(10_000, 1_000)
    start = time.perf_counter()
    result = plan(inputs)
    took = time.perf_counter() - start
    refused = [d for d in result.decisions if d.mode == "refused"]
    floor = sum(1 for d in refused if d.reason_code == "BudgetBelowElasticMinimum")
    print(f"10,000 models / 1,000 H200: {len(refused)} refused, floor {floor} (budget below the elastic "
          f"minimum); {len(refused) - floor} above the floor ({(len(refused) - floor) / max(floor, 1):.1%}); "
          f"planned in {took:.2f} s")


def moved(before, after, skip: str | None) -> int:
    was = {d.name: (d.slot, d.mode, d.resident_layers) for d in before.decisions}
    return sum(1 for d in after.decisions
               if d.name != skip and d.name in was and was[d.name] != (d.slot, d.mode, d.resident_layers))


def churn(trials: int, seed: int) -> None:
    for spare, label in ((0, "loaded fleet"), (10, "10 spare GPUs")):
        base = synthetic_inputs(200, 20 + spare, seed=seed)
        extra = synthetic_inputs(400, 1, seed=seed + 1).models[200:]  # models not in the fleet
        first = plan(base)
        previous = {d.key: d for d in first.decisions}
        rng = random.Random(seed)
        for change in ("add one", "remove one", "raise one budget"):
            with_prev, without = [], []
            for t in range(trials):
                models = list(base.models)
                skip = None
                if change == "add one":
                    new = replace(extra[t % len(extra)], name=f"new-{t:03d}")
                    models.append(new)
                    skip = new.name
                elif change == "remove one":
                    gone = models.pop(rng.randrange(len(models)))
                    skip = gone.name
                else:
                    i = rng.randrange(len(models))
                    models[i] = replace(models[i], budget_bytes=int(models[i].budget_bytes * rng.uniform(1.1, 2.0)))
                    skip = models[i].name
                changed = replace(base, models=tuple(models))
                with_prev.append(moved(first, plan(changed, previous), skip))
                without.append(moved(first, plan(changed), skip))
            print(f"churn, {label}, {change}: moved others with previous decisions "
                  f"{_dist(with_prev)}; without them {_dist(without)}")


def _dist(values: list[int]) -> str:
    ordered = sorted(values)
    p = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    share = sum(1 for v in values if v) / len(values)
    return (f"median {statistics.median(values):g}, p90 {p(0.9)}, p95 {p(0.95)}, max {max(values)}, mean "
            f"{statistics.mean(values):.2f}, trials with any move {share:.0%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fleets", type=int, default=400)
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--mixed", type=int, default=100)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--sized", type=int, default=40, help="fleets per size against the exact search")
    parser.add_argument("--issue", type=int, default=30, help="fleets of issue 33's kind against the exact search")
    args = parser.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, load average {os.getloadavg()[0]:.1f}")
    small_fleets(max(args.fleets, 2), args.seed)
    if args.mixed:
        mixed_fleets(args.mixed, args.seed)
    against_exact(args.sized, args.issue, args.seed)
    at_scale()
    churn(args.trials, args.seed)


if __name__ == "__main__":
    main()
