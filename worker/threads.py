"""The worker's intra-op threads: how many CPUs the process may use, and how many threads torch gets.

Owns `usable_cpus` (the fewest of: the CPUs in the process's affinity mask, and the CPU quota of its
cgroup, v2 `cpu.max` or v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`, rounded up) and `choose_threads`,
the rule with its overrides, in this order:
1. `python -m worker --intra-op-threads N`;
2. the worker config's `server.intraOpThreads`;
3. `OMP_NUM_THREADS` in the environment (what torch itself reads);
4. the rule: one thread per usable CPU but one, at least one. The CPU left over runs the HTTP event loop,
   tokenization and the emitter, which the executors' steps must never wait for; concurrent requests share
   one batched step per model (engine/batch.py), so more threads than CPUs only make the steps fight.
Called once by `python -m worker` before any model loads; /status shows the count in force.
"""
from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class Threads:
    count: int
    why: str  # where the count came from, for the log line


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _own_cgroup(proc_cgroup: str | None) -> str:
    """The v2 cgroup path of this process (the `0::/path` line of /proc/self/cgroup), "/" when unknown."""
    for line in (proc_cgroup or "").splitlines():
        if line.startswith("0::"):
            return line[3:] or "/"
    return "/"


def cgroup_cpu_limit(root: Path = CGROUP_ROOT, proc_cgroup: str | None = None) -> tuple[float, str] | None:
    """(CPUs, where) of the process's cgroup CPU quota; None when it has none (or none can be read)."""
    v2 = root / _own_cgroup(proc_cgroup).lstrip("/") / "cpu.max"
    for path in (v2, root / "cpu.max"):
        text = _read(path)
        if text:
            quota, _, period = text.partition(" ")
            if quota == "max":
                return None
            try:
                return int(quota) / int(period or 100000), f"cgroup v2 {path}: {text}"
            except ValueError:
                return None
    for folder in ("cpu,cpuacct", "cpu"):
        quota, period = _read(root / folder / "cpu.cfs_quota_us"), _read(root / folder / "cpu.cfs_period_us")
        if quota is not None and period is not None:
            try:
                q, p = int(quota), int(period)
            except ValueError:
                return None
            return (q / p, f"cgroup v1 cfs_quota_us {q} / cfs_period_us {p}") if q > 0 and p > 0 else None
    return None


def usable_cpus(root: Path = CGROUP_ROOT, proc_cgroup: str | None = None,
                affinity: set[int] | None = None) -> tuple[int, str]:
    """(CPUs this process may use, how that was found): the affinity mask, bounded by the cgroup quota."""
    if affinity is None:
        affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    cpus, why = max(1, len(affinity)), f"{len(affinity)} CPUs in the affinity mask"
    if proc_cgroup is None:
        proc_cgroup = _read(Path("/proc/self/cgroup"))
    limit = cgroup_cpu_limit(root, proc_cgroup)
    if limit is not None and math.ceil(limit[0]) < cpus:
        cpus, why = max(1, math.ceil(limit[0])), f"{limit[0]:g} CPUs of quota ({limit[1]}), {why}"
    return cpus, why


def choose_threads(flag: int | None, config: int | None, environ: Mapping[str, str] = os.environ,
                   usable: tuple[int, str] | None = None) -> Threads:
    """The intra-op thread count and why: the flag, else the config, else OMP_NUM_THREADS, else the rule
    (usable CPUs - 1, at least 1)."""
    if flag is not None:
        return Threads(flag, "--intra-op-threads")
    if config is not None:
        return Threads(config, "server.intraOpThreads in the worker config")
    omp = environ.get("OMP_NUM_THREADS", "").strip()
    if omp.isdigit() and int(omp) > 0:
        return Threads(int(omp), "OMP_NUM_THREADS")
    cpus, why = usable if usable is not None else usable_cpus()
    return Threads(max(1, cpus - 1), f"{cpus} usable CPUs ({why}) less one for the API and tokenization")
