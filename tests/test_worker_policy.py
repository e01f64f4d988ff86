"""The scheduling policy, pure and clocked by hand: min residency, drain before swap, LRU,
per-model concurrency, round robin; and the swap bound under random load."""
from __future__ import annotations

import random

import pytest

from worker.policy import Idle, QueuePolicy, Step, SwapIn


def policy(*, swap=("a", "b", "c"), others=(), min_residency_s=1.0, max_queued=8, concurrency=1):
    p = QueuePolicy(min_residency_s=min_residency_s, max_queued=max_queued)
    for name in swap:
        p.add_model(name, concurrency=concurrency, swap=True)
    for name in others:
        p.add_model(name, concurrency=concurrency, swap=False)
    return p


def run_step(p: QueuePolicy, now: float) -> Step | SwapIn | Idle:
    """Take the next action; a Step finishes its job at once; a SwapIn activates."""
    action = p.next_action(now)
    if isinstance(action, SwapIn):
        p.activated(action.model, now)
    elif isinstance(action, Step):
        p.finished(action.model, action.job)
    return action


def test_first_request_swaps_its_model_in_then_runs():
    p = policy()
    p.enqueue("b", "b1")
    assert p.next_action(0.0) == SwapIn("b", evict=None)
    p.activated("b", 0.0)
    assert p.next_action(0.0) == Step("b", "b1")


def test_active_model_keeps_admitting_until_min_residency_then_drains_before_the_swap():
    p = policy(min_residency_s=1.0)
    p.enqueue("a", "a1")
    run_step(p, 0.0)  # swap a in
    assert p.next_action(0.1) == Step("a", "a1")  # a1 running (not finished yet)
    p.enqueue("b", "b1")
    p.enqueue("a", "a2")
    assert p.next_action(0.5) == Step("a", "a1"), "before min residency a keeps running"
    p.finished("a", "a1")
    assert p.next_action(0.6) == Step("a", "a2"), "before min residency a admits new work"
    p.enqueue("a", "a3")
    assert p.next_action(1.2) == Step("a", "a2"), "draining: a2 is in flight and must finish first"
    p.finished("a", "a2")
    assert p.next_action(1.3) == SwapIn("b", evict="a"), "drained: swap although a3 still waits"
    assert list(p.queued["a"]) == ["a3"]


def test_idle_active_model_is_not_evicted_before_min_residency():
    p = policy(min_residency_s=2.0)
    p.enqueue("a", "a1")
    run_step(p, 0.0)
    run_step(p, 0.1)  # a1 done
    p.enqueue("b", "b1")
    assert p.next_action(0.5) == Idle(pytest.approx(1.5))
    assert p.next_action(2.0) == SwapIn("b", evict="a")


def test_least_recently_active_waiting_model_goes_next():
    p = policy(min_residency_s=0.0)
    for model, t in (("a", 0.0), ("b", 1.0), ("c", 2.0)):
        p.enqueue(model, f"{model}1")
        run_step(p, t)
        run_step(p, t)
    p.enqueue("a", "a2")
    p.enqueue("b", "b2")
    assert p.next_action(3.0) == SwapIn("a", evict="c"), "a was active longest ago"


def test_models_outside_the_swap_group_always_run_and_respect_concurrency():
    p = policy(swap=("a",), others=("r",), concurrency=2)
    for job in ("r1", "r2", "r3"):
        p.enqueue("r", job)
    assert isinstance(p.next_action(0.0), Step)
    assert p.running["r"] == ["r1", "r2"] and list(p.queued["r"]) == ["r3"], "concurrency caps running jobs"


def test_round_robin_steps_every_running_job():
    p = policy(swap=(), others=("r", "s"), concurrency=2)
    for model, job in (("r", "r1"), ("r", "r2"), ("s", "s1")):
        p.enqueue(model, job)
    seen = {p.next_action(0.0).job for _ in range(3)}
    assert seen == {"r1", "r2", "s1"}


def test_queue_capacity_is_per_model():
    p = policy(max_queued=2)
    p.enqueue("a", "a1")
    p.enqueue("a", "a2")
    assert not p.has_room("a") and p.has_room("b")


@pytest.mark.parametrize("seed", range(5))
def test_swaps_stay_within_the_min_residency_bound_and_nothing_starves(seed):
    rng = random.Random(seed)
    p = policy(min_residency_s=0.5, max_queued=10_000, concurrency=2)
    now, swaps, done = 0.0, 0, []
    for i in range(400):
        p.enqueue(rng.choice("abc"), i)
    while len(done) < 400:
        action = run_step(p, now)
        if isinstance(action, SwapIn):
            swaps += 1
        elif isinstance(action, Step):
            done.append(action.job)
        now += action.timeout_s if isinstance(action, Idle) and action.timeout_s else 0.01
    assert sorted(done) == list(range(400)), "every request was served"
    assert swaps <= 1 + now / 0.5, f"{swaps} swaps in {now:.1f}s breaks the min-residency bound"
    assert swaps >= 3
