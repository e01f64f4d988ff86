"""A neighbour added to and removed from a running worker never disturbs the model it serves: a real
`python -m worker` process on CPU serves one model under steady requests from the official `openai` client
(plain and streamed) while its config file gains a neighbour, which loads and serves, and then loses it,
which drains and goes, and then gains a neighbour whose files are missing, which is refused alone; the worker
process is the same one throughout and every request of the steady model succeeds, in each phase."""
from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest

from worker_support import WorkerProcess, config_document, model_entry, tiny_models  # noqa: F401

pytestmark = pytest.mark.slow  # a worker process
WAIT_S = 60
CLIENTS = 2


class SteadyLoad:
    """CLIENTS threads asking `model` for a few tokens, one request after another, until stopped; each outcome is
    recorded with the phase it started in."""

    def __init__(self, base_url: str, model: str):
        self.client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=WAIT_S)
        self.model, self.phase = model, "alone"
        self.ok: dict[str, int] = {}
        self.failures: list[str] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(CLIENTS)]

    def _run(self, client: int) -> None:
        n = 0
        while not self.stop.is_set():
            phase, n = self.phase, n + 1
            try:
                if (n + client) % 2:
                    text = self.client.completions.create(model=self.model, prompt="hi", max_tokens=3,
                                                          temperature=0).usage.completion_tokens
                    assert text == 3
                else:
                    chunks = list(self.client.chat.completions.create(
                        model=self.model, messages=[{"role": "user", "content": "hi"}], max_tokens=3, temperature=0,
                        stream=True))
                    assert chunks[-1].choices[0].finish_reason in ("length", "stop")  # a whole stream, no error
                self.ok[phase] = self.ok.get(phase, 0) + 1
            except Exception as exc:  # noqa: BLE001 - every failure is the finding
                self.failures.append(f"{phase}: {type(exc).__name__}: {exc}")

    def __enter__(self) -> "SteadyLoad":
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=WAIT_S)

    def wait_for_requests(self, phase: str, count: int) -> None:
        deadline = time.monotonic() + WAIT_S
        while self.ok.get(phase, 0) < count:
            assert time.monotonic() < deadline, f"fewer than {count} requests completed while {phase}"
            time.sleep(0.05)


def _wait(predicate, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.1)


def _states(base_url: str) -> dict[str, str]:
    return {m["name"]: m["state"] for m in httpx.get(base_url + "/status", timeout=10).json()["models"]}


def test_a_neighbour_added_then_removed_never_fails_a_request_of_the_model_served(tiny_models, tmp_path):
    steady = model_entry("steady", tiny_models["llama"], "resident")
    neighbour = model_entry("neighbour", tiny_models["qwen2"], "resident")
    with WorkerProcess(tmp_path, config_document([steady]), args=["--watch-seconds", "0.2"]) as worker:
        pid = worker.process.pid
        with SteadyLoad(worker.base_url, "steady") as load:
            load.wait_for_requests("alone", 5)
            load.phase = "adding"
            worker.write(config_document([steady, neighbour]))
            _wait(lambda: _states(worker.base_url).get("neighbour") == "serving", "the neighbour serves")
            client = openai.OpenAI(base_url=f"{worker.base_url}/v1", api_key="unused", max_retries=0)
            assert client.completions.create(model="neighbour", prompt="hi", max_tokens=2,
                                             temperature=0).usage.completion_tokens == 2
            load.phase = "beside"
            load.wait_for_requests("beside", 5)
            load.phase = "removing"
            worker.write(config_document([steady]))
            _wait(lambda: "neighbour" not in _states(worker.base_url), "the neighbour is gone")
            load.phase = "after"
            load.wait_for_requests("after", 5)
            load.phase = "broken"  # a neighbour whose files are not on the node is refused alone, in place
            worker.write(config_document([steady, model_entry("broken", "/models/not-on-this-node", "resident")]))
            _wait(lambda: _states(worker.base_url).get("broken") == "refused", "the broken neighbour is refused")
            load.wait_for_requests("broken", 5)
        assert worker.process.poll() is None and worker.process.pid == pid, "the worker restarted"
        models = httpx.get(worker.base_url + "/v1/models", timeout=10).json()["data"]
    print(f"\nsteady requests per phase: {load.ok}")
    assert [m["id"] for m in models] == ["steady"]  # a refused model is not listed
    assert not load.failures, load.failures[:5]
    assert all(load.ok.get(phase, 0) >= 1 for phase in ("alone", "beside", "after", "broken")), load.ok
