"""A full reconcile pass over 10,000 ElasticModels (load + plan + render + write + commit + push),
then a pass with nothing new; prints both times.

Targets (issue 3): full pass ≤ 15 s; a pass with nothing new ≤ 100 ms, independent of
the number of models. The remote is a local bare repository (file path); the models
are spread over 50 namespaces, 200 per file, on 1,000 H200 slots with the shipped
estimated profiles. Run: .venv/bin/python bench/reconcile_scale.py [--models N --slots M]
"""
from __future__ import annotations

import argparse
import os
import platform
import random
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import yaml

import controller.cli.offline
from controller.cli.offline import reconcile_once
from gitops import WorkingCopy

FLEET = Path(__file__).resolve().parent.parent / "examples" / "fleet"
MODELS = ("Qwen/Qwen2.5-0.5B-Instruct", "meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-32B-Instruct",
          "meta-llama/Llama-3.1-70B-Instruct")
MIX = (0.45, 0.4, 0.12, 0.03)
BUDGET_GIB = {"Qwen/Qwen2.5-0.5B-Instruct": (2, 4), "meta-llama/Llama-3.1-8B-Instruct": (12, 24),
              "Qwen/Qwen2.5-32B-Instruct": (40, 80), "meta-llama/Llama-3.1-70B-Instruct": (30, 150)}


def write_repo(root: Path, n_models: int, n_slots: int, seed: int = 11) -> None:
    rng = random.Random(seed)
    shutil.copytree(FLEET / "profiles", root / "profiles")
    nodes = [{"name": f"gpu-node-{i:04d}", "product": "NVIDIA-H200", "memory": "143771Mi", "count": 8}
             for i in range(n_slots // 8)]
    (root / "gpus.yaml").write_text(yaml.safe_dump(
        {"apiVersion": "gpushare.dev/v1alpha1", "kind": "GPUInventory", "nodes": nodes}))
    docs: dict[str, list[dict]] = {}
    for i in range(n_models):
        model = rng.choices(MODELS, weights=MIX)[0]
        low, high = BUDGET_GIB[model]
        namespace = f"team-{i % 50:02d}"
        docs.setdefault(f"models/{namespace}/batch-{i // 200 % 2}.yaml", []).append({
            "apiVersion": "gpushare.dev/v1alpha1", "kind": "ElasticModel",
            "metadata": {"name": f"m-{i:05d}", "namespace": namespace},
            "spec": {"model": model, "memoryBudget": f"{rng.randint(low, high)}Gi",
                     "slo": {"contextTokens": rng.choice((2048, 4096, 8192)), "concurrency": rng.choice((1, 2, 4))},
                     "gpu": {"product": "NVIDIA-H200"}},
        })
    for path, items in docs.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(yaml.safe_dump_all(items, sort_keys=False))


def git(*args: str, cwd: Path) -> None:
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@example.invalid",
           "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@example.invalid"}
    subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True)


def measure(base: Path, n_models: int, n_slots: int) -> dict:
    """Seed a bare remote with a fleet of `n_models`, then time a full pass, an unchanged re-render
    and a pass with nothing new against it."""
    seed, remote = base / f"seed-{n_models}", base / f"remote-{n_models}.git"
    seed.mkdir()
    write_repo(seed, n_models, n_slots)
    git("init", "-q", "-b", "main", cwd=seed)
    git("add", "--all", cwd=seed)
    git("commit", "-q", "-m", "fleet", cwd=seed)
    git("clone", "-q", "--bare", str(seed), str(remote), cwd=base)
    copy = WorkingCopy(str(remote), "main", base / f"controller-{n_models}")
    pass_times: list[float] = []
    timed_pass = controller.cli.offline.pass_over

    def pass_over(root, **kwargs):
        start = time.perf_counter()
        try:
            return timed_pass(root, **kwargs)
        finally:
            pass_times.append(time.perf_counter() - start)

    controller.cli.offline.pass_over = pass_over  # time the pure pass apart from git
    try:
        start = time.perf_counter()
        full = reconcile_once(copy)
        full_s = time.perf_counter() - start
        start = time.perf_counter()
        again = reconcile_once(copy)
        rerender_s = time.perf_counter() - start
        start = time.perf_counter()
        idle = reconcile_once(copy, previous=again.published)
        idle_s = time.perf_counter() - start
    finally:
        controller.cli.offline.pass_over = timed_pass
    return {"files": len(full.output.rendered.files), "full_s": full_s, "render_s": pass_times[0],
            "committed": full.published.changed, "rerender_s": rerender_s, "rerender_committed": again.published.changed,
            "idle_s": idle_s, "idle_committed": idle.published.changed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=10_000)
    parser.add_argument("--slots", type=int, default=1_000)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="gpushare-bench-"))
    try:
        big = measure(base, args.models, args.slots)
        small = measure(base, args.models // 10, args.slots // 10)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"{args.models} models on {args.slots} slots -> {big['files']} generated files")
    print(f"full pass (load, plan, render, write, commit, push): {big['full_s']:.2f} s "
          f"[{'met' if big['full_s'] <= 15 else 'MISSED'}: target <= 15 s] committed={big['committed']}")
    print(f"  of which reading inputs, planning and rendering: {big['render_s']:.2f} s; "
          f"writing, committing and pushing: {big['full_s'] - big['render_s']:.2f} s")
    for n, run in ((args.models, big), (args.models // 10, small)):
        print(f"pass with nothing new, {n} models (fetch finds no branch moved): {run['idle_s'] * 1000:.0f} ms "
              f"[{'met' if run['idle_s'] <= 0.1 else 'MISSED'}: target <= 100 ms, independent of the model count] "
              f"committed={run['idle_committed']}")
    print(f"re-render with nothing new, {args.models} models (no previous result given): {big['rerender_s']:.2f} s "
          f"committed={big['rerender_committed']}")


if __name__ == "__main__":
    main()
