"""The worker under abuse, as a process (`python -m worker`) on 127.0.0.1: a bounded soak of mixed valid and
hostile requests, oversized bodies and disconnects, with no 5xx, /healthz p99 under 200 ms and RSS that stops
growing; then SIGTERM exits within the grace period, also with a stream that could never finish.

The soak lasts GPUSHARE_SOAK_SECONDS (default 10; the acceptance run uses 60) and prints its figures.
"""
from __future__ import annotations

import asyncio
import os
import random
import signal
import threading
import time
from collections import Counter

import httpx
import pytest
import yaml

from hostile import CHAT_FIELDS, COMPLETION_FIELDS, RAW_BODIES, message_mutations, mutations
from worker_support import WorkerProcess, config_document, model_entry, tiny_models  # noqa: F401

SOAK_S = float(os.environ.get("GPUSHARE_SOAK_SECONDS", "10"))
GRACE_S = 2  # --grace-seconds
GRACE = ("--grace-seconds", str(GRACE_S))
POD_GRACE_S = GRACE_S + 2  # the Pod's terminationGracePeriodSeconds, a little above it
LIMIT = 256 * 1024
CLIENTS = 6
HEALTH_P99_S = 0.2
RSS_GROWTH_BYTES = 64 << 20  # after warm-up; a leak of a request's buffers would pass it within seconds


def _document(tiny_models, **server) -> dict:
    models = [model_entry("r", tiny_models["llama"], "resident", concurrency=2),
              model_entry("e", tiny_models["gpt2"], "elastic", residentLayers=2),
              model_entry("sa", tiny_models["qwen2"], "swap"), model_entry("sb", tiny_models["llama-b"], "swap")]
    document = config_document(models, max_queued=16, min_residency_ms=server.pop("min_residency_ms", 200))
    document["server"].update({"maxRequestBytes": LIMIT, "sseKeepAliveMs": 100, **server})
    return document


class Load:
    """CLIENTS tasks sending a seeded mix of requests until `until`; records every status (or what broke)."""

    def __init__(self, base_url: str, port: int, seed: int = 0):
        self.base_url, self.port = base_url, port
        self.random = random.Random(seed)
        self.hostile = (list(mutations({"model": "r", "prompt": "hi", "max_tokens": 2}, COMPLETION_FIELDS))
                        + list(mutations({"model": "e", "messages": [{"role": "user", "content": "x"}],
                                          "max_tokens": 2}, CHAT_FIELDS))
                        + list(message_mutations({"model": "sa", "messages": [{"role": "user", "content": "x"}],
                                                  "max_tokens": 2})))
        self.statuses: Counter[str] = Counter()
        self.server_errors: list[str] = []

    async def run(self, seconds: float) -> None:
        until = time.monotonic() + seconds
        async with httpx.AsyncClient(base_url=self.base_url, timeout=30) as client:
            await asyncio.gather(*(self._client(client, until) for _ in range(CLIENTS)))

    async def _client(self, client: httpx.AsyncClient, until: float) -> None:
        actions = [self.valid, self.valid, self.valid, self.hostile_body, self.hostile_body, self.raw_body,
                   self.oversized, self.oversized_chunked, self.stream_then_leave, self.leave_mid_body,
                   self.give_up_waiting]
        while time.monotonic() < until:
            action = self.random.choice(actions)
            try:
                await action(client)
            except (httpx.TransportError, OSError) as exc:  # counted: the soak asserts which actions saw them
                self.statuses[f"transport:{type(exc).__name__}:{action.__name__}"] += 1

    def _record(self, what: str, response: httpx.Response, text: str | None = None) -> None:
        self.statuses[str(response.status_code)] += 1
        if response.status_code >= 500:
            body = response.text if text is None else text  # a streamed body was read as it came
            self.server_errors.append(f"{what}: {response.status_code} {body[:200]}")

    async def valid(self, client):
        model = self.random.choice(["r", "e", "sa", "sb"])
        body = {"model": model, "max_tokens": self.random.randint(1, 12), "temperature": self.random.random(),
                "stream": self.random.random() < 0.5}
        if self.random.random() < 0.5:
            path, body = "/v1/completions", {**body, "prompt": "soak " * self.random.randint(1, 30)}
        else:
            path, body = "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": "soak"}],
                                                  "n": self.random.randint(1, 2), "logprobs": True}
        if body["stream"]:
            async with client.stream("POST", path, json=body) as response:
                text = "".join([chunk async for chunk in response.aiter_text()])
            self._record(f"valid stream {body}", response, text)
            assert response.status_code != 200 or text.endswith("data: [DONE]\n\n"), text[-200:]
        else:
            self._record(f"valid {body}", await client.post(path, json=body))

    async def hostile_body(self, client):
        case, body = self.random.choice(self.hostile)
        path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        self._record(f"hostile {case}", await client.post(path, json=body))

    async def raw_body(self, client):
        raw = self.random.choice(RAW_BODIES)
        self._record(f"raw {raw[:20]!r}", await client.post("/v1/completions", content=raw))

    async def oversized(self, client):
        body = b'{"model": "r", "prompt": "' + b"a" * (LIMIT * self.random.randint(1, 8)) + b'"}'
        self._record("oversized", await client.post("/v1/completions", content=body))

    async def oversized_chunked(self, client):
        async def chunks():
            for _ in range(LIMIT // 16384 + 4):
                yield b" " * 16384

        self._record("oversized chunked", await client.post("/v1/chat/completions", content=chunks()))

    async def stream_then_leave(self, client):
        body = {"model": self.random.choice(["r", "e", "sb"]), "prompt": "leave", "max_tokens": 40, "stream": True}
        async with client.stream("POST", "/v1/completions", json=body) as response:
            async for _ in response.aiter_lines():
                break  # hang up after the first line
        self.statuses["left-mid-stream"] += 1

    async def leave_mid_body(self, client):
        _, writer = await asyncio.open_connection("127.0.0.1", self.port)
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 5000\r\n\r\n{\"model\": \"r\", ")
        await writer.drain()
        writer.close()
        self.statuses["left-mid-body"] += 1

    async def give_up_waiting(self, client):
        try:
            await client.post("/v1/completions", timeout=0.02,
                              json={"model": "sa", "prompt": "slow", "max_tokens": 60})
        except httpx.TimeoutException:
            self.statuses["gave-up"] += 1


class HealthProbe(threading.Thread):
    """GET /healthz every 20 ms from its own thread; keeps each answer's latency."""

    def __init__(self, base_url: str):
        super().__init__(daemon=True)
        self.base_url, self.latencies, self.failures = base_url, [], []
        self.stop = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.base_url, timeout=5) as client:
            while not self.stop.wait(0.02):
                started = time.perf_counter()
                try:
                    status = client.get("/healthz").status_code
                except httpx.TransportError as exc:
                    self.failures.append(type(exc).__name__)
                    continue
                self.latencies.append(time.perf_counter() - started)
                if status != 200:
                    self.failures.append(str(status))

    def p99(self) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


@pytest.mark.slow
def test_soak_mixed_abuse_no_server_errors_healthz_fast_rss_bounded_and_sigterm_in_grace(tiny_models, tmp_path):
    with WorkerProcess(tmp_path, _document(tiny_models), args=GRACE) as worker:
        probe = HealthProbe(worker.base_url)
        probe.start()
        load = Load(worker.base_url, worker.port)
        rss: list[tuple[float, int]] = []
        started = time.monotonic()

        def sample_rss():
            while probe.is_alive() and not probe.stop.wait(0.25):
                rss.append((time.monotonic() - started, worker.rss_bytes()))

        sampler = threading.Thread(target=sample_rss, daemon=True)
        sampler.start()
        asyncio.run(load.run(SOAK_S))
        # SIGTERM while the last requests of a second burst are in flight
        burst = threading.Thread(target=lambda: asyncio.run(Load(worker.base_url, worker.port, seed=1).run(3)))
        burst.start()
        time.sleep(0.5)
        probe.stop.set()
        probe.join()
        exit_s = worker.terminate(POD_GRACE_S + 10)
        burst.join(timeout=10)
        returncode = worker.process.poll()

    warm = [b for t, b in rss if t <= SOAK_S / 3]
    late = [b for t, b in rss if t > SOAK_S / 3]
    print(f"\nsoak {SOAK_S:.0f} s, {CLIENTS} clients: {sum(load.statuses.values())} requests "
          f"{dict(sorted(load.statuses.items()))}; healthz n={len(probe.latencies)} p99={probe.p99() * 1000:.1f} ms "
          f"max={max(probe.latencies) * 1000:.1f} ms; RSS warm max {max(warm) >> 20} MiB, later max "
          f"{max(late) >> 20} MiB; SIGTERM exit {exit_s:.2f} s (grace {GRACE_S} s)")
    assert not load.server_errors, load.server_errors[:5]
    assert {"200", "400", "413"} <= set(load.statuses), load.statuses
    assert not [s for s in load.statuses if s.startswith("transport:")], load.statuses  # 413s arrive too
    assert not probe.failures, probe.failures[:5]
    assert probe.p99() < HEALTH_P99_S
    assert max(late) - max(warm) < RSS_GROWTH_BYTES
    assert returncode in (0, -signal.SIGTERM) and exit_s < POD_GRACE_S


@pytest.mark.slow
def test_sigterm_exits_within_the_grace_period_with_a_stream_that_would_never_finish(tiny_models, tmp_path):
    document = _document(tiny_models, min_residency_ms=600_000)
    with WorkerProcess(tmp_path, document, args=GRACE) as worker:
        httpx.post(worker.base_url + "/v1/completions", json={"model": "sa", "prompt": "a", "max_tokens": 1},
                   timeout=30)  # sa holds the device for ten minutes: a request for sb waits that long
        lines: list[str] = []

        def wait_for_sb():
            try:
                with httpx.stream("POST", worker.base_url + "/v1/completions", timeout=30,
                                  json={"model": "sb", "prompt": "b", "stream": True}) as response:
                    lines.extend(response.iter_lines())
            except httpx.TransportError:
                pass

        waiting = threading.Thread(target=wait_for_sb)
        waiting.start()
        deadline = time.monotonic() + 10
        while not lines and time.monotonic() < deadline:  # the stream is open: keep-alive comments flow
            time.sleep(0.05)
        assert lines and lines[0] == ": keep-alive"
        exit_s = worker.terminate(POD_GRACE_S + 10)
        waiting.join(timeout=10)
        assert worker.process.poll() in (0, -signal.SIGTERM), "the worker did not stop on SIGTERM"
    assert exit_s < POD_GRACE_S, f"exited {exit_s:.2f} s after SIGTERM with a grace of {GRACE_S} s"
