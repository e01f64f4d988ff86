"""Read a right-sizing window from Prometheus' HTTP API for N models; print the time and the peak memory.

The installed controller reads `--rightsize-window` (2d) of usage on a `--rightsize-step` grid (60 s)
every `--rightsize-interval`, in a pod whose memory limit is 1 GiB (config/manager/deployment.yaml).
This reads that window through controller.rightsizing.prometheus.read_usage from a Prometheus double
on 127.0.0.1 (tests/promdouble.py: every query answered, one constant series per model), so the
figures are the controller's: HTTP, JSON, the grid and the samples. Peak memory is the process'
maximum resident set. Run: .venv/bin/python bench/usage_read.py [--models 200 --window-hours 48 --step 60]
"""
from __future__ import annotations

import argparse
import os
import platform
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/promdouble.py

from controller.rightsizing.prometheus import read_usage  # noqa: E402
from tests.promdouble import PrometheusDouble  # noqa: E402

GiB = 1 << 30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=200)
    parser.add_argument("--window-hours", type=float, default=48)
    parser.add_argument("--step", type=int, default=60)
    args = parser.parse_args()
    every_field = {"deviceBytes": 4 * GiB, "kvUsedBytes": GiB // 4, "kvReservedBytes": GiB, "budgetBytes": 8 * GiB,
                   "queueWaitSeconds": 0.01, "ttftSeconds": 0.2, "tpotSeconds": 0.02, "refusals": 0,
                   "missingBytes": 0, "ooms": 0}  # a series for every query, as a busy fleet has
    usage = {f"team/model-{i:04d}": dict(every_field) for i in range(args.models)}
    print(f"machine: {platform.machine()}, {len(os.sched_getaffinity(0))} cores, Python {platform.python_version()}")
    with PrometheusDouble(usage, args.step) as prom:
        end = time.time()
        started = time.perf_counter()
        samples = read_usage(prom.url, end - args.window_hours * 3600, end, args.step)
        took = time.perf_counter() - started
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{args.models} models, {args.window_hours:g} h at {args.step} s: {len(samples)} samples, "
          f"{len(prom.asked)} queries, {took:.1f} s, peak resident {peak_mib:.0f} MiB (the controller's limit: 1024 MiB)")


if __name__ == "__main__":
    main()
