"""A full reconcile pass over 10,000 ElasticModels (load + plan + render + write + commit + push), a re-render
with nothing new in a fresh process and work directory, and a pass with nothing new; prints each time with the
pure pass's share and git's.

Targets: full pass ≤ 15 s and a pass with nothing new ≤ 100 ms, independent of the number of models (issue
3); the full pass and a re-render in a fresh process ≤ 8 s each (issue 18). The remote is a local bare
repository (file path); the models are spread over 50 namespaces, 200 per file, on 1,000 H200 slots with the
shipped estimated profiles. Each measurement runs in its own process (`--child`), as a restarted controller
pod with an emptyDir runs: the full pass (then, in the same process and directory, a re-render and a pass
with nothing new), then a re-render from a fresh process and work directory against the full pass's commit.

`--compare REV` measures another version of the project the same way (a `git worktree` of REV, run with
PYTHONPATH=<that checkout>), interleaved with this one (this, REV, REV, this, ...: `--runs` of each), on the
same fleet, and prints a side-by-side table. The child opens the working copy as that version's controller
does (controller.cli.common.controller_copy where it exists, else a full checkout).

Run: .venv/bin/python bench/reconcile_scale.py [--models N --slots M] [--compare REV [--runs K]]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
FLEET = ROOT / "examples" / "fleet"
MODELS = ("Qwen/Qwen2.5-0.5B-Instruct", "meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-32B-Instruct",
          "meta-llama/Llama-3.1-70B-Instruct")
MIX = (0.45, 0.4, 0.12, 0.03)
BUDGET_GIB = {"Qwen/Qwen2.5-0.5B-Instruct": (2, 4), "meta-llama/Llama-3.1-8B-Instruct": (12, 24),
              "Qwen/Qwen2.5-32B-Instruct": (40, 80), "meta-llama/Llama-3.1-70B-Instruct": (30, 150)}
GOAL_S = 8.0  # issue 18: the full pass and a re-render in a fresh process


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


def git(*args: str, cwd: Path) -> str:
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@example.invalid",
           "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@example.invalid"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


def seed_remote(base: Path, n_models: int, n_slots: int) -> Path:
    """A bare repository whose main holds a fleet of `n_models` (no generated file yet)."""
    seed, remote = base / f"seed-{n_models}", base / f"seed-{n_models}.git"
    seed.mkdir()
    write_repo(seed, n_models, n_slots)
    git("init", "-q", "-b", "main", cwd=seed)
    git("add", "--all", cwd=seed)
    git("commit", "-q", "-m", "fleet", cwd=seed)
    git("clone", "-q", "--bare", str(seed), str(remote), cwd=base)
    return remote


# ---------------------------------------------------------------- one measurement, in its own process


def child(kind: str, remote: str, workdir: Path) -> dict:
    """`full`: a full pass, then a re-render and a pass with nothing new in the same process and directory;
    `rerender`: a re-render with nothing new. Each with the seconds the pure pass (read, plan, render) took."""
    start = time.perf_counter()
    import controller.cli.offline as offline
    from gitops import WorkingCopy
    try:
        from controller.cli.common import controller_copy
    except ImportError:  # a version without a sparse working copy: the whole tree, as its controller checks out
        def controller_copy(repo, branch, directory):
            return WorkingCopy(repo, branch, directory)
    imports_s = time.perf_counter() - start
    pass_times: list[float] = []
    timed_pass = offline.pass_over

    def pass_over(root, **kwargs):
        begin = time.perf_counter()
        try:
            return timed_pass(root, **kwargs)
        finally:
            pass_times.append(time.perf_counter() - begin)

    offline.pass_over = pass_over  # time the pure pass apart from git

    def timed(run) -> tuple[float, float, object]:
        del pass_times[:]
        begin = time.perf_counter()
        result = run()
        return time.perf_counter() - begin, sum(pass_times), result

    copy = controller_copy(remote, "main", workdir)
    first_s, first_pass_s, first = timed(lambda: offline.reconcile_once(copy))
    out = {"kind": kind, "imports_s": imports_s, "s": first_s, "pass_s": first_pass_s,
           "committed": first.published.changed, "files": len(first.output.rendered.files) if first.output else 0,
           "checked_out": checked_out(workdir)}
    if kind == "full":
        same_s, same_pass_s, again = timed(lambda: offline.reconcile_once(copy))
        idle_s, _, idle = timed(lambda: offline.reconcile_once(copy, previous=again.published))
        out.update(same_s=same_s, same_pass_s=same_pass_s, same_committed=again.published.changed, idle_s=idle_s,
                   idle_committed=idle.published.changed)
    return out


def checked_out(workdir: Path) -> int:
    """How many files the work tree holds (not counting .git)."""
    count = 0
    for _, dirs, files in os.walk(workdir):
        dirs[:] = [d for d in dirs if d != ".git"]
        count += len(files)
    return count


def run_child(project: Path, kind: str, remote: Path, workdir: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(project)}
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", kind, "--remote", str(remote),
                           "--workdir", str(workdir)], env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the {kind} measurement of {project} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(project: Path, seed: Path, base: Path, tag: str, fresh: bool = True) -> dict:
    """A full pass (fresh process and directory) against a copy of the seed remote, then (`fresh`) a re-render
    with nothing new from another fresh process and directory."""
    remote = base / f"remote-{tag}.git"
    git("clone", "-q", "--bare", str(seed), str(remote), cwd=base)
    load = os.getloadavg()[0]
    full = run_child(project, "full", remote, base / f"controller-{tag}")
    rerender = run_child(project, "rerender", remote, base / f"restarted-{tag}") if fresh else None
    shutil.rmtree(remote, ignore_errors=True)
    for directory in (base / f"controller-{tag}", base / f"restarted-{tag}"):
        shutil.rmtree(directory, ignore_errors=True)
    return {"full": full, "rerender": rerender, "load": load}


# ---------------------------------------------------------------- printing


def split(seconds: float, pass_s: float) -> str:
    return f"{seconds:.2f} s (pass {pass_s:.2f} s, git {seconds - pass_s:.2f} s)"


def print_lines(n_models: int, n_slots: int, big: dict, small: dict) -> None:
    full, fresh = big["full"], big["rerender"]
    print(f"{n_models} models on {n_slots} slots -> {full['files']} generated files "
          f"({fresh['checked_out']} of the repository's files checked out by the controller)")
    print(f"full pass (load, plan, render, write, commit, push): {full['s']:.2f} s "
          f"[{'met' if full['s'] <= 15 else 'MISSED'}: target <= 15 s] committed={full['committed']}")
    print(f"  of which reading inputs, planning and rendering: {full['pass_s']:.2f} s; "
          f"writing, committing and pushing: {full['s'] - full['pass_s']:.2f} s")
    for n, run in ((n_models, big), (n_models // 10, small)):
        idle = run["full"]["idle_s"]
        print(f"pass with nothing new, {n} models (fetch finds no branch moved): {idle * 1000:.0f} ms "
              f"[{'met' if idle <= 0.1 else 'MISSED'}: target <= 100 ms, independent of the model count] "
              f"committed={run['full']['idle_committed']}")
    print(f"re-render with nothing new, {n_models} models (no previous result given): {full['same_s']:.2f} s "
          f"committed={full['same_committed']}")
    print(f"  same process and work directory: {split(full['same_s'], full['same_pass_s'])}")
    print(f"re-render in a fresh process and work directory (a restarted controller): "
          f"{split(fresh['s'], fresh['pass_s'])} [{'met' if fresh['s'] <= GOAL_S else 'MISSED'}: goal <= 8 s] "
          f"committed={fresh['committed']}; imports {fresh['imports_s']:.2f} s before it")
    print(f"full pass in a fresh process and work directory: {split(full['s'], full['pass_s'])} "
          f"[{'met' if full['s'] <= GOAL_S else 'MISSED'}: goal <= 8 s]")


def print_table(n_models: int, n_slots: int, rows: list[tuple[str, dict]], versions: int) -> None:
    print(f"\n| {n_models:,} models, {n_slots:,} slots | version | full pass | of which the pass | git | "
          "re-render, fresh process and directory | of which the pass | git | re-render, same directory | "
          "files checked out | load average at start |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for index, (version, run) in enumerate(rows, 1):
        full, fresh = run["full"], run["rerender"]
        print(f"| run {(index - 1) // versions + 1} | {version} | {full['s']:.2f} s | {full['pass_s']:.2f} s | "
              f"{full['s'] - full['pass_s']:.2f} s | {fresh['s']:.2f} s | {fresh['pass_s']:.2f} s | "
              f"{fresh['s'] - fresh['pass_s']:.2f} s | {full['same_s']:.2f} s | {fresh['checked_out']:,} | "
              f"{run['load']:.1f} |")


def checkout_of(revision: str, base: Path) -> tuple[Path, str]:
    """A detached worktree of `revision` of this project under `base`, and the commit it names."""
    commit = git("rev-parse", "--verify", f"{revision}^{{commit}}", cwd=ROOT)
    where = base / f"version-{commit[:12]}"
    git("worktree", "add", "-q", "--detach", str(where), commit, cwd=ROOT)
    return where, commit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=10_000)
    parser.add_argument("--slots", type=int, default=1_000)
    parser.add_argument("--compare", metavar="REV", help="also measure this revision of the project, interleaved")
    parser.add_argument("--runs", type=int, help="runs of each version (default: 1, or 2 with --compare)")
    parser.add_argument("--child", choices=("full", "rerender"), help=argparse.SUPPRESS)
    parser.add_argument("--remote", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.remote, args.workdir)))
        return
    runs = args.runs or (2 if args.compare else 1)
    base = Path(tempfile.mkdtemp(prefix="gpushare-bench-"))
    other = None
    try:
        this = git("rev-parse", "--short=12", "HEAD", cwd=ROOT) + ("+" if git("status", "--porcelain", "--",
                                                                           ".", cwd=ROOT) else "")
        versions = [(f"this ({this})", ROOT)]
        if args.compare:
            other, commit = checkout_of(args.compare, base)
            versions.append((f"{args.compare} ({commit[:12]})", other))
        seed = seed_remote(base, args.models, args.slots)
        rows = []
        for run in range(runs):
            order = versions if run % 2 == 0 else versions[::-1]
            for name, project in order:
                rows.append((name, measure(project, seed, base, f"{len(rows)}")))
        small_seed = seed_remote(base, args.models // 10, args.slots // 10)
        small = measure(ROOT, small_seed, base, "small", fresh=False)
    finally:
        if other is not None:
            git("worktree", "remove", "--force", str(other), cwd=ROOT)
        shutil.rmtree(base, ignore_errors=True)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print_lines(args.models, args.slots, next(run for name, run in rows if name == versions[0][0]), small)
    print_table(args.models, args.slots, rows, len(versions))


if __name__ == "__main__":
    main()
