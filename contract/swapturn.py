"""The swap turn: how long a swapped-in model keeps the device while others wait.

One fact with two readers: the worker's queue policy enforces it (worker/policy.py, through
worker/config.py's default for `server.minResidencyMs`), and the planner bounds a swap
group's worst wait with it (controller/planning/cost.py). The worker-config schema states
the same default; tests/test_swapturn.py holds the three together. Pure.
"""
from __future__ import annotations

MIN_RESIDENCY_MS = 2000  # a swapped-in model stays at least this long, so alternating requests do not thrash
