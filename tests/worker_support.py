"""Helpers for the worker tests: tiny saved models, config documents, and servers in threads.

Imported by tests/test_worker_*.py (fixtures here are re-exported by each module that uses them).
"""
from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch
import yaml

from engine.batch import Generation
from engine.sampling import SamplingParams
from worker.scheduler import ErrorEvent, FinishEvent

from tinymodels import save_tiny_model

REPO_ROOT = Path(__file__).resolve().parent.parent
FAMILIES = ("llama", "qwen2", "gpt2")
MiB = 1 << 20


_saved: dict[str, Path] = {}


@pytest.fixture(scope="module", autouse=True)
def single_threaded_torch():
    """Tiny models run 40x slower with intra-op threads on a busy 2-core machine (53 ms vs 1.2 ms a
    step); modules that import this fixture run torch on one thread and restore the setting after."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    """One saved tiny model per family (4 decoder layers, float32), plus a second llama with other weights.

    Each test module imports this fixture (so pytest sees one definition per module); the models
    are saved once per session all the same.
    """
    if not _saved:
        root = tmp_path_factory.mktemp("tiny-models")
        _saved.update({family: save_tiny_model(root / family, family) for family in FAMILIES})
        _saved["llama-b"] = save_tiny_model(root / "llama-b", "llama", seed=1)
    return dict(_saved)


# A chat template that renders tools and tool calls (as Qwen's and Llama 3's do), for the tiny models.
TOOLS_TEMPLATE = (
    "{% if tools %}<|tools|>{% for t in tools %}{{ t['function']['name'] }};{% endfor %}{{ '\\n' }}{% endif %}"
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}"
    "{% for c in m.get('tool_calls') or [] %}[{{ c['function']['name'] }} {{ c['function']['arguments'] | tojson }}]"
    "{% endfor %}{{ '\\n' }}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def with_tools_template(model: Path, directory: Path) -> Path:
    """A copy of the saved `model` in `directory` whose chat template is TOOLS_TEMPLATE."""
    copy = directory / f"{model.name}-tools"
    shutil.copytree(model, copy)
    (copy / "chat_template.jinja").write_text(TOOLS_TEMPLATE)
    return copy


def model_entry(name: str, path: Path, mode: str, *, budget: int = 320 * MiB, context: int = 256,
                concurrency: int = 2, **extra) -> dict:
    return {"name": name, "namespace": "llm", "model": str(path), "mode": mode, "budgetBytes": budget,
            "contextTokens": context, "concurrency": concurrency, **extra}


def config_document(models: list[dict], *, capacity: int = 8 << 30, max_queued: int = 64,
                    min_residency_ms: int = 0, verdicts: dict | None = None) -> dict:
    doc = {"apiVersion": "gpushare.dev/v1alpha1", "kind": "WorkerConfig",
           "slot": {"id": "node-a/gpu0", "product": "NVIDIA-H200", "capacityBytes": capacity},
           "device": "cpu", "server": {"maxQueuedRequests": max_queued, "minResidencyMs": min_residency_ms},
           "models": models}
    if verdicts:
        doc["verdicts"] = {"configMap": verdicts}
    return doc


def generation(prompt=(72, 105), tokens=4) -> Generation:
    return Generation(prompt_ids=list(prompt), params=SamplingParams(max_tokens=tokens, temperature=0),
                      eos_ids=frozenset(), decode=lambda ids: "")


class Collector:
    """A job's sink: records events; `done` is set by the finish or error event."""

    def __init__(self):
        self.events, self.done = [], threading.Event()

    def __call__(self, event):
        self.events.append(event)
        if isinstance(event, (FinishEvent, ErrorEvent)):
            self.done.set()


def started_worker(document: dict, **kwargs):
    """A Worker from `document`, started and fully loaded (caller stops it)."""
    from worker.config import parse_config
    from worker.runtime import Worker

    worker = Worker(parse_config(document), device=torch.device("cpu"), **kwargs)
    worker.start()
    assert worker.wait_loaded(60), "models did not load within 60 s"
    return worker


class ServerThread:
    """uvicorn serving `app` on 127.0.0.1 at a free port, in a thread; `with` starts and stops it."""

    def __init__(self, app):
        import uvicorn

        # proto IPPROTO_TCP: asyncio sets TCP_NODELAY only then; without it every response waits ~40 ms
        # for a delayed ACK (uvicorn writes headers and body separately)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off",
                                                    timeout_graceful_shutdown=1))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "ServerThread":
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


class KubeApiThread:
    """kmock's Kubernetes API emulator served over HTTP from its own event loop in a thread."""

    def __enter__(self):
        import kmock
        from kmock._internal import apps

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

        async def enter():
            emulator = kmock.KubernetesEmulator()
            await emulator.__aenter__()
            server = apps.Server(emulator)
            await server.__aenter__()
            return emulator, server

        self.emulator, self.server = self.run(enter())
        return self

    def run(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=10)

    def core_v1(self):
        from kubernetes import client

        return client.CoreV1Api(client.ApiClient(client.Configuration(host=str(self.server.url))))

    def methods(self) -> list[str]:
        """HTTP methods of the requests the emulator received, in order (e.g. ["PATCH", "POST"])."""
        return [str(request.method.value).upper() for request in self.emulator]

    def configmap(self, namespace: str, name: str) -> dict:
        import kmock

        return dict(self.emulator.objects[kmock.resource("", "v1", "configmaps"), namespace, name].last.raw)

    def __exit__(self, *exc) -> None:
        async def leave():
            await self.server.__aexit__(None, None, None)
            await self.emulator.__aexit__(None, None, None)

        self.run(leave())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        self.loop.close()


class WorkerProcess:
    """`python -m worker` on a free port in its own session, with `args` added to its command line and `env` to
    its environment (OMP_NUM_THREADS=1 unless `env` sets it; a value None removes the variable); `with` waits
    until each of `ready` (default: every model of `document`) serves, and kills what is left on the way out. With
    `stderr` (a path), its standard error goes to that file."""

    def __init__(self, tmp_path: Path, document: dict, *, args=(), env: dict | None = None, ready=None,
                 stderr: Path | None = None):
        self.config = tmp_path / "worker.yaml"
        self.write(document)
        self.ready = list(ready) if ready is not None else [m["name"] for m in document["models"]]
        self.args, self.env, self.stderr = list(args), env or {}, stderr
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}"

    def write(self, document: dict) -> None:
        """Write the config file the worker reads (and watches, with --watch-seconds)."""
        self.config.write_text(yaml.safe_dump(document))

    def __enter__(self) -> "WorkerProcess":
        env = {k: v for k, v in {**os.environ, "OMP_NUM_THREADS": "1", **self.env}.items() if v is not None}
        command = [sys.executable, "-m", "worker", "--config", str(self.config), "--port", str(self.port),
                   "--log-level", "error", *self.args]
        errors = self.stderr.open("wb") if self.stderr is not None else None
        try:
            self.process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, start_new_session=True, stderr=errors)
        finally:
            if errors is not None:
                errors.close()
        deadline = time.monotonic() + 90
        while True:
            assert self.process.poll() is None, f"the worker exited with {self.process.returncode}"
            assert time.monotonic() < deadline, "the worker did not become ready in 90 s"
            try:  # /readyz answers 200 once one model serves: wait until every model asked for does
                if all(httpx.get(f"{self.base_url}/readyz/{name}", timeout=1).status_code == 200
                       for name in self.ready):
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)

    def rss_bytes(self) -> int:
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) * 1024

    def terminate(self, timeout_s: float = 20) -> float:
        """SIGTERM; seconds until the process exited (or `timeout_s` passed)."""
        started = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
        return time.monotonic() - started

    def __exit__(self, *exc) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
