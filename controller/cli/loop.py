"""The poll loop every long-running mode shares: one pass every interval, backoff after failures.

Owns the timing rule of `gpushare reconcile --interval` (offline) and of cluster
mode: after a good pass wait the interval with ±10 % jitter; after the n-th
failure in a row wait min(cap, base × 2^(n-1)) × a factor in [0.5, 1]; a pass may
ask for its own wait (a standby replica asks for the Lease again soon); the garbage a pass left
(controller.cpu.gc_paused) is collected after it, before the wait. The
pass, the waiting (a cluster leader renews its Lease while it waits) and the
clock's randomness are passed in, so tests drive it without sleeping.
"""
from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from controller.cpu import collect

BACKOFF_BASE_S = 1.0
MAX_BACKOFF_S = 300.0


@dataclass(frozen=True)
class Outcome:
    ok: bool
    wait_s: float | None = None  # the pass's own next wait, instead of the interval or the backoff


def backoff_s(failures: int, *, base_s: float = BACKOFF_BASE_S, cap_s: float = MAX_BACKOFF_S,
              jitter: Callable[[float, float], float] = random.uniform) -> float:
    """Exponential with jitter: base × 2^(failures-1), capped, times a factor in [0.5, 1]."""
    return min(cap_s, base_s * 2 ** (failures - 1)) * jitter(0.5, 1.0)


def run_loop(one_pass: Callable[[], Outcome], interval_s: float, *, wait: Callable[[float], None],
             stopped: Callable[[], bool] = lambda: False, passes: int | None = None,
             jitter: Callable[[float, float], float] = random.uniform, backoff_base_s: float = BACKOFF_BASE_S,
             max_backoff_s: float = MAX_BACKOFF_S,
             on_retry: Callable[[float], None] = lambda seconds: None) -> int:
    """Pass after pass until `stopped()` (or `passes` passes); 0 when the last pass succeeded, else 1."""
    failures = done = 0
    while not stopped() and (passes is None or done < passes):
        outcome = one_pass()
        collect()  # what the pass left to the collector, now that its commit is pushed
        done += 1
        if outcome.ok:
            failures = 0
            seconds = interval_s * jitter(0.9, 1.1)
        else:
            failures += 1
            seconds = backoff_s(failures, base_s=backoff_base_s, cap_s=max_backoff_s, jitter=jitter)
            on_retry(seconds)
        if outcome.wait_s is not None:
            seconds = outcome.wait_s
        if passes is None or done < passes:
            wait(seconds)
    return 0 if failures == 0 else 1
