"""The scheduling policy, pure and clocked by hand: per-model batches up to the concurrency, min
residency, drain before swap, LRU, one swap-in at a time, every swap-in serves at least one step
(minResidencyMs 0 included), and the swap bound under random load."""
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


def act(p: QueuePolicy, model: str, now: float, *, finish=True) -> Step | SwapIn | Idle:
    """`model`'s executor takes its next action: a SwapIn activates; a Step counts as a step and (with
    `finish`) finishes its whole batch."""
    action = p.next_action(model, now)
    if isinstance(action, SwapIn):
        p.activated(action.model, now)
    elif isinstance(action, Step):
        p.stepped(model)
        if finish:
            for job in action.jobs:
                p.finished(model, job)
    return action


def test_first_request_swaps_its_model_in_then_runs():
    p = policy()
    p.enqueue("b", "b1")
    assert p.next_action("a", 0.0) == Idle(None), "a has nothing queued: it is not chosen"
    assert p.next_action("b", 0.0) == SwapIn("b", evict=None)
    p.activated("b", 0.0)
    assert p.next_action("b", 0.0) == Step("b", ("b1",))


def test_one_swap_in_at_a_time():
    p = policy()
    p.enqueue("b", "b1")
    p.enqueue("c", "c1")
    first = p.next_action("b", 0.0)
    assert first == SwapIn("b", evict=None)
    assert isinstance(p.next_action("c", 0.0), Idle), "c waits while b swaps in"


def test_active_model_keeps_admitting_until_min_residency_then_drains_before_the_swap():
    p = policy(min_residency_s=1.0)
    p.enqueue("a", "a1")
    act(p, "a", 0.0)  # swap a in
    assert act(p, "a", 0.1, finish=False) == Step("a", ("a1",))
    p.enqueue("b", "b1")
    p.enqueue("a", "a2")
    assert isinstance(p.next_action("b", 0.5), Idle), "before min residency b waits"
    p.finished("a", "a1")
    assert p.next_action("a", 0.6) == Step("a", ("a2",)), "before min residency a admits new work"
    p.enqueue("a", "a3")
    assert p.next_action("a", 1.2) == Step("a", ("a2",)), "draining: a3 does not join"
    assert isinstance(p.next_action("b", 1.2), Idle), "a2 is in flight and must finish first"
    p.finished("a", "a2")
    assert p.next_action("b", 1.3) == SwapIn("b", evict="a"), "drained: swap although a3 still waits"
    assert list(p.queued["a"]) == ["a3"]


def test_a_batch_admits_up_to_the_concurrency_and_refills_at_step_boundaries():
    p = policy(swap=(), others=("r",), concurrency=2)
    for job in ("r1", "r2", "r3"):
        p.enqueue("r", job)
    assert p.next_action("r", 0.0) == Step("r", ("r1", "r2"))
    p.finished("r", "r1")
    assert p.next_action("r", 0.0) == Step("r", ("r2", "r3")), "r3 joins the running batch"


def test_idle_active_model_is_not_evicted_before_min_residency():
    p = policy(min_residency_s=2.0)
    p.enqueue("a", "a1")
    act(p, "a", 0.0)
    act(p, "a", 0.1)  # a1 done
    p.enqueue("b", "b1")
    assert p.next_action("b", 0.5) == Idle(pytest.approx(1.5))
    assert p.next_action("b", 2.0) == SwapIn("b", evict="a")


def test_least_recently_active_waiting_model_goes_next():
    p = policy(min_residency_s=0.0)
    for model, t in (("a", 0.0), ("b", 1.0), ("c", 2.0)):
        p.enqueue(model, f"{model}1")
        act(p, model, t)
        act(p, model, t)
    p.enqueue("a", "a2")
    p.enqueue("b", "b2")
    assert p.next_action("b", 3.0) == Idle(None), "b is not the longest waiting"
    assert p.next_action("a", 3.0) == SwapIn("a", evict="c"), "a was active longest ago"


def test_with_zero_min_residency_a_swapped_in_model_serves_a_step_before_it_drains():
    p = policy(min_residency_s=0.0, concurrency=2)
    p.enqueue("a", "a1")
    p.enqueue("b", "b1")
    assert act(p, "a", 0.0) == SwapIn("a", evict=None)
    assert isinstance(p.next_action("b", 0.0), Idle), "a has not served a step yet"
    assert act(p, "a", 0.0, finish=False) == Step("a", ("a1",)), "a admits its queue despite b waiting"
    p.enqueue("a", "a2")
    assert p.next_action("a", 0.0) == Step("a", ("a1",)), "after its step a drains: a2 does not join"
    p.finished("a", "a1")
    assert p.next_action("b", 0.0) == SwapIn("b", evict="a")


def test_models_outside_the_swap_group_run_while_the_group_swaps():
    p = policy(swap=("a", "b"), others=("r",))
    p.enqueue("a", "a1")
    p.enqueue("r", "r1")
    assert p.next_action("a", 0.0) == SwapIn("a", evict=None)
    assert p.next_action("r", 0.0) == Step("r", ("r1",)), "r's executor does not wait for the swap-in"


def test_queue_capacity_is_per_model_and_withdrawn_jobs_free_it():
    p = policy(max_queued=2)
    p.enqueue("a", "a1")
    p.enqueue("a", "a2")
    assert not p.has_room("a") and p.has_room("b")
    assert p.withdraw("a", "a1") and p.has_room("a")
    assert not p.withdraw("a", "a1"), "a job that is not queued cannot be withdrawn"


def simulate(p: QueuePolicy, models: list[str], jobs: int, *, min_residency_s: float, seed: int,
             max_steps: int = 100_000) -> tuple[int, float, list]:
    """Drive every model's executor in turn under random arrivals; each job needs 1-3 steps."""
    rng = random.Random(seed)
    remaining, done, now, swaps = {}, [], 0.0, 0
    for i in range(jobs):
        p.enqueue(rng.choice(models), i)
        remaining[i] = rng.randint(1, 3)
    for _ in range(max_steps):
        if len(done) == jobs:
            break
        waits = []
        for model in models:
            action = p.next_action(model, now)
            if isinstance(action, SwapIn):
                p.activated(model, now)
                swaps += 1
            elif isinstance(action, Step):
                p.stepped(model)
                for job in action.jobs:
                    remaining[job] -= 1
                    if remaining[job] == 0:
                        p.finished(model, job)
                        done.append(job)
            elif action.timeout_s:
                waits.append(action.timeout_s)
        now += min(waits) if waits else 0.01
    return swaps, now, done


@pytest.mark.parametrize("seed", range(4))
def test_swaps_stay_within_the_min_residency_bound_and_nothing_starves(seed):
    p = policy(min_residency_s=0.5, max_queued=10_000, concurrency=2)
    swaps, now, done = simulate(p, ["a", "b", "c"], 300, min_residency_s=0.5, seed=seed)
    assert sorted(done) == list(range(300)), "every request was served"
    assert swaps <= 1 + now / 0.5, f"{swaps} swaps in {now:.1f}s breaks the min-residency bound"
    assert swaps >= 3


@pytest.mark.parametrize("seed", range(4))
def test_zero_min_residency_makes_progress_with_at_most_one_swap_per_finished_batch(seed):
    p = policy(min_residency_s=0.0, max_queued=10_000, concurrency=2)
    swaps, _, done = simulate(p, ["a", "b", "c"], 300, min_residency_s=0.0, seed=seed, max_steps=5_000)
    assert sorted(done) == list(range(300)), "livelock: not every request finished"
    assert swaps <= len(done), f"{swaps} swaps for {len(done)} finished requests"
