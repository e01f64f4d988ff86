"""Per-model executors on CPU: cancelling frees a KV slot for the next request; a neighbour's
swap-in or long elastic step does not hold up a resident model's steps (measured in its steps);
two swap models with minResidencyMs 0 under concurrent load all finish (no livelock) beside a
resident and an elastic neighbour; /healthz reports an executor stuck in one step; SIGTERM drains
and exits within the grace period."""
from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
import yaml

from engine.batch import Generation
from engine.sampling import SamplingParams
from worker.scheduler import FinishEvent
from worker_support import (  # noqa: F401  (fixtures are used by name)
    REPO_ROOT, Collector, config_document, generation, model_entry, started_worker, single_threaded_torch,
    tiny_models,
)

WAIT_S = 60  # a bound on waiting for another thread; never reached when the behaviour holds
NEIGHBOUR_STEPS = 5  # resident steps that must complete while a neighbour's swap-in or step is held open


def wait_for(predicate, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


@pytest.fixture
def worker_of(tiny_models):
    started = []

    def make(models, **kwargs):
        worker = started_worker(config_document(models, **kwargs))
        started.append(worker)
        return worker

    yield make
    for worker in started:
        worker.stop()


def test_cancelling_a_running_request_frees_its_slot_for_the_queued_one(worker_of, tiny_models):
    worker = worker_of([model_entry("m", tiny_models["llama"], "resident", concurrency=2, context=512)])
    engine = worker.served["m"].engine
    long = [Collector() for _ in range(2)]
    jobs = [worker.submit("m", generation(tokens=400), sink) for sink in long]
    wait_for(lambda: len(engine.seated) == 2, "both requests to be seated")
    waiting = Collector()
    queued = worker.submit("m", generation(tokens=2), waiting)
    assert list(worker.scheduler.policy.queued["m"]) == [queued], "no free slot: the third request queues"
    jobs[0].cancelled = True
    assert waiting.done.wait(WAIT_S), "the cancelled request's slot went to the queued one"
    assert isinstance(waiting.events[-1], FinishEvent) and waiting.events[-1].completion_tokens == 2
    assert not long[0].done.is_set(), "a cancelled request gets no more events"
    jobs[1].cancelled = True
    wait_for(lambda: not engine.seated, "the batch to empty")


def letters(ids) -> str:
    return "".join(chr(ord("a") + token % 26) for token in ids)


def test_a_steps_events_reach_their_consumer_in_one_hand_off(worker_of, tiny_models):
    """All of a step's events for one consumer (an event loop) go in one `post`, not one per token."""
    worker = worker_of([model_entry("m", tiny_models["llama"], "resident", concurrency=3)])
    posts = []

    def post(run):
        posts.append(run)
        run()

    sinks = [Collector() for _ in range(3)]
    for sink in sinks:
        worker.submit("m", Generation(prompt_ids=[72, 105], params=SamplingParams(max_tokens=8, temperature=0),
                                      eos_ids=frozenset(), decode=letters), sink, post)
    for sink in sinks:
        assert sink.done.wait(WAIT_S) and isinstance(sink.events[-1], FinishEvent)
    events = sum(len(sink.events) for sink in sinks)
    assert events == 3 * 9, "each token's text, then the finish"
    assert len(posts) <= 8 + 2, f"{len(posts)} hand-offs for {events} events: one per step, not per event"


def test_a_stop_string_frees_the_slot_at_once(worker_of, tiny_models):
    """A stop string ends its request on the emitter's side: its slot goes to the queued request long before
    the stopped one's max_tokens, and it is counted as a request served."""
    worker = worker_of([model_entry("m", tiny_models["llama"], "resident", concurrency=1, context=512)])
    engine = worker.served["m"].engine
    stopped, queued = Collector(), Collector()
    stops = tuple("abcdefghijklm")  # half the letters: the answer stops within a few tokens
    worker.submit("m", Generation(prompt_ids=[72, 105], params=SamplingParams(max_tokens=400, temperature=0,
                                                                              stop=stops),
                                  eos_ids=frozenset(), decode=letters), stopped)
    worker.submit("m", generation(tokens=2), queued)
    assert stopped.done.wait(WAIT_S) and queued.done.wait(WAIT_S)
    finish = stopped.events[-1]
    assert isinstance(finish, FinishEvent) and finish.reason == "stop" and finish.completion_tokens < 100
    text = "".join(e.text for e in stopped.events[:-1])
    assert not any(stop in text for stop in stops), "the stop string is not part of the answer"
    wait_for(lambda: not engine.seated, "the batch to empty")
    assert engine.steps < 100, "the stopped request kept its slot"
    served = worker.metrics.registry.get_sample_value(worker.metrics.requests._name + "_total",
                                                      {"model": "m", "outcome": "ok"})
    assert served == 2


def test_cancelling_a_queued_request_withdraws_it_at_once(worker_of, tiny_models):
    worker = worker_of([model_entry("a", tiny_models["llama"], "swap"), model_entry("b", tiny_models["qwen2"], "swap")],
                       min_residency_ms=600_000)
    first = Collector()
    worker.submit("a", generation(tokens=1), first)
    assert first.done.wait(WAIT_S)
    job = worker.submit("b", generation(tokens=1), Collector())  # waits for a's 10 minutes of residency
    job.cancelled = True
    assert list(worker.scheduler.policy.queued["b"]) == [], "withdrawn without waiting for a step"


@pytest.mark.parametrize("neighbour", ["swap-in", "elastic-step"])
def test_a_neighbour_does_not_hold_up_a_resident_models_steps(worker_of, tiny_models, neighbour):
    models = [model_entry("resident", tiny_models["llama"], "resident", context=512),
              model_entry("swap", tiny_models["qwen2"], "swap"),
              model_entry("elastic", tiny_models["llama-b"], "elastic", residentLayers=1)]
    worker = worker_of(models)
    resident = worker.served["resident"].engine
    running = Collector()
    worker.submit("resident", generation(tokens=400), running)
    wait_for(lambda: resident.steps > 2, "the resident model to decode")
    held = {}

    def hold_until_resident_steps():
        """Runs inside the neighbour's swap-in or elastic layer: returns once the resident model has
        taken NEIGHBOUR_STEPS more steps (never, if its steps waited for this neighbour)."""
        if held:
            return
        held["from"] = resident.steps
        deadline = time.monotonic() + WAIT_S
        while resident.steps < held["from"] + NEIGHBOUR_STEPS and time.monotonic() < deadline:
            time.sleep(0.001)
        held["to"] = resident.steps

    if neighbour == "swap-in":
        residency = worker.served["swap"].residency
        activate = residency.activate
        residency.activate = lambda: (hold_until_resident_steps(), activate())
        target = "swap"
    else:
        residency = worker.served["elastic"].residency
        enter = residency.enter_layer
        residency.enter_layer = lambda i: (hold_until_resident_steps() if i == 2 else None, enter(i))
        target = "elastic"
    other = Collector()
    worker.submit(target, generation(tokens=1), other)
    assert other.done.wait(WAIT_S)
    assert held["to"] - held["from"] >= NEIGHBOUR_STEPS, (
        f"the resident model took {held['to'] - held['from']} steps during the neighbour's {neighbour}")
    assert isinstance(other.events[-1], FinishEvent)


def test_two_swap_models_with_zero_min_residency_finish_beside_resident_and_elastic_neighbours(worker_of,
                                                                                                tiny_models):
    models = [model_entry("swap-a", tiny_models["llama"], "swap", concurrency=2),
              model_entry("swap-b", tiny_models["qwen2"], "swap", concurrency=2),
              model_entry("resident", tiny_models["llama-b"], "resident"),
              model_entry("elastic", tiny_models["gpt2"], "elastic", residentLayers=1)]
    worker = worker_of(models, min_residency_ms=0)
    plan = ["swap-a", "swap-b"] * 15 + ["resident", "elastic"] * 3
    sinks = [Collector() for _ in plan]
    for model, sink in zip(plan, sinks):
        worker.submit(model, generation(tokens=3), sink)
    for model, sink in zip(plan, sinks):
        assert sink.done.wait(WAIT_S), f"a request to {model} never finished"
        assert isinstance(sink.events[-1], FinishEvent), sink.events[-1]
    assert 2 <= worker.scheduler.swaps <= 30, f"{worker.scheduler.swaps} swaps for 30 swap requests"


class ManualClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_liveness_fails_while_an_executor_is_stuck_in_one_step_and_recovers(tiny_models):
    clock = ManualClock()
    worker = started_worker(config_document([model_entry("m", tiny_models["llama"], "resident")]),
                            clock=clock, stall_s=30)
    try:
        engine = worker.served["m"].engine
        release, inside = threading.Event(), threading.Event()
        step = engine.step

        def stuck_step():
            inside.set()
            release.wait(WAIT_S)
            return step()

        engine.step = stuck_step
        sink = Collector()
        worker.submit("m", generation(tokens=1), sink)
        assert inside.wait(WAIT_S)
        assert worker.health()[0], "a step that just started is not a stall"
        clock.now += 31
        live, detail = worker.health()
        assert not live and "one step or swap has run for 31s" in detail["stalled"]["m"]
        release.set()
        assert sink.done.wait(WAIT_S)
        assert worker.health()[0], "the executor moved on: live again"
    finally:
        worker.stop()


def test_sigterm_drains_and_exits_within_the_grace_period(tiny_models, tmp_path):
    grace_s = 6
    config = tmp_path / "worker.yaml"
    config.write_text(yaml.safe_dump(config_document(
        [model_entry("m", tiny_models["llama"], "resident", context=20_000, budget=1 << 30)])))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen([sys.executable, "-m", "worker", "--config", str(config), "--port", str(port),
                                "--log-level", "warning", "--grace-seconds", str(grace_s)], cwd=REPO_ROOT,
                               start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + WAIT_S
        while True:
            assert process.poll() is None and time.monotonic() < deadline, "the worker did not become ready"
            try:
                if httpx.get(base + "/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        # a request that would decode for far longer than the grace period (greedy: this model's greedy
        # continuation of "go" never samples end-of-text, as a random one may)
        with httpx.stream("POST", base + "/v1/completions", timeout=WAIT_S,
                          json={"model": "m", "prompt": "go", "max_tokens": 19_000, "stream": True,
                                "temperature": 0}) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data: "), "the long request is decoding"
            signalled = time.monotonic()
            process.send_signal(signal.SIGTERM)
            rest = list(lines)
        returncode = process.wait(timeout=grace_s + 10)
        took = time.monotonic() - signalled
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    # the grace period plus a margin for interpreter teardown on a loaded CI machine; the cut request alone
    # would decode for far longer
    assert took <= grace_s + 4, f"exited {took:.1f}s after SIGTERM; the grace period is {grace_s}s"
    assert returncode in (0, -signal.SIGTERM)
    assert any('"ShuttingDown"' in line for line in rest), f"the cut request was not told why: {rest[-4:]}"
