"""Git's share of a restarted controller's first pass: a fresh work directory fetched and checked out, whole
(as before issue 18) or sparse (gitops.WorkingCopy with the folders of controller.inputs.layout.CONE), and the
generated paths listed (from the directory, or from `git ls-tree`); prints each run and the medians.

The sparse copy holds the user's folders, the last good copies and the right-sizing records; a pass reads the
decision records, PLAN.md and the workers' Deployments and ConfigMaps from git (gitops.Checkout.read). The
tree is the one bench/reconcile_scale.py builds and commits (10,000 models on 1,000 slots by default, one full
pass first); the checkouts alternate, `--runs` of each. Run:
.venv/bin/python bench/checkout_scale.py [--models N --slots M --runs K]
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from reconcile_scale import checked_out, seed_remote

from controller.cli.offline import reconcile_once
from controller.inputs.layout import CONE, GENERATED
from controller.inputs.repofiles import owned_files
from gitops import WorkingCopy
from gitops.workcopy import owned_paths


def one(remote: Path, workdir: Path, folders: tuple[str, ...] | None) -> dict:
    """Open a working copy in the fresh `workdir`, sync it, list the generated paths: the seconds of each."""
    sparse = folders is not None
    begin = time.perf_counter()
    copy = WorkingCopy(str(remote), "main", workdir, cone=folders)
    heads = copy.fetch()
    fetched = time.perf_counter()
    copy.checkout(heads["main"])
    checked = time.perf_counter()
    paths = owned_paths(copy.entries(heads["main"], GENERATED), GENERATED) if sparse else owned_files(workdir, GENERATED)
    listed = time.perf_counter()
    return {"fetch": fetched - begin, "checkout": checked - fetched, "list": listed - checked,
            "total": listed - begin, "paths": len(paths), "files": checked_out(workdir)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=10_000)
    parser.add_argument("--slots", type=int, default=1_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="gpushare-checkout-"))
    try:
        remote = seed_remote(base, args.models, args.slots)
        reconcile_once(WorkingCopy(str(remote), "main", base / "first"))  # the generated tree, committed
        modes = {"whole tree": None, "sparse": CONE}
        runs: dict[str, list[dict]] = {name: [] for name in modes}
        for run in range(args.runs):
            for name in (list(modes) if run % 2 == 0 else list(modes)[::-1]):
                workdir = base / f"run-{run}-{name.replace(' ', '-').replace(',', '')}"
                runs[name].append(one(remote, workdir, modes[name]))
                shutil.rmtree(workdir)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average {os.getloadavg()[0]:.1f}")
    for name, results in runs.items():
        first = results[0]
        folders = "" if modes[name] is None else f", {len(modes[name])} folders (cone mode, a sparse index)"
        print(f"{name}: {first['files']} files written, {first['paths']} generated paths listed{folders}")
        for key in ("fetch", "checkout", "list", "total"):
            values = [r[key] for r in results]
            print(f"  {key}: median {statistics.median(values):.2f} s (runs: "
                  f"{', '.join(f'{v:.2f}' for v in values)})")


if __name__ == "__main__":
    main()
