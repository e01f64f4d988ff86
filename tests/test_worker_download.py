"""Models download on first use: a gated, missing or unreachable hub model becomes a typed refusal carrying the
Hub's own reason, the worker's verdict says so, and the ElasticModel turns Degraded with that reason. The Hub is a
double on 127.0.0.1 that answers as the real one refuses (status, X-Error-Code, X-Error-Message): no network."""
from __future__ import annotations

import dataclasses
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import huggingface_hub.constants
import pytest

from controller.observe.status import WorkerVerdict, conditions_for
from tests.test_status import ALL_GOOD, MODEL, RESIDENT
from worker.download import ByteProgress, progress_line, snapshot
from worker.errors import ModelLoadError

GATED = "Access to model org/gated is restricted. You must have access to it and be authenticated to access it."


class FakeHub(BaseHTTPRequestHandler):
    answers: dict[str, tuple[int, dict[str, str]]] = {}
    seen: list[tuple[str, str | None]] = []

    def do_GET(self):  # noqa: N802 - http.server's name
        FakeHub.seen.append((self.path, self.headers.get("Authorization")))
        repo = self.path.split("/api/models/", 1)[-1].split("/revision/")[0]
        status, headers = FakeHub.answers.get(repo, (404, {"X-Error-Code": "RepoNotFound",
                                                           "X-Error-Message": "Repository not found"}))
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def hub(monkeypatch, tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeHub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_TOKEN", "hf_SecretToken123")
    FakeHub.seen = []
    FakeHub.answers = {
        "org/gated": (403, {"X-Error-Code": "GatedRepo", "X-Error-Message": GATED}),
        "org/moved": (404, {"X-Error-Code": "RevisionNotFound", "X-Error-Message": "Invalid rev id: v9"}),
        "org/flaky": (400, {"X-Error-Message": "Bad request: the Hub is confused"}),
    }
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("repo, reason, hub_words", [
    pytest.param("org/gated", "HubAccessDenied", GATED.rstrip("."), id="gated-model-access-denied"),
    pytest.param("org/absent", "HubModelNotFound", "Repository not found", id="missing-model-not-found"),
    pytest.param("org/moved", "HubRevisionNotFound", "Invalid rev id: v9", id="missing-revision-not-found"),
    pytest.param("org/flaky", "HubDownloadFailed", "Bad request: the Hub is confused", id="other-hub-error-failed"),
])
def test_hub_refusals_become_typed_errors_with_the_hubs_reason(hub, repo, reason, hub_words):
    with pytest.raises(ModelLoadError) as caught:
        snapshot(repo, "v9" if repo == "org/moved" else "main")
    assert caught.value.reason == reason
    assert hub_words in caught.value.message and repo in caught.value.message
    assert "hf_SecretToken123" not in caught.value.message
    asked = [auth for path, auth in FakeHub.seen if path.startswith(f"/api/models/{repo}/")]
    assert asked and set(asked) == {"Bearer hf_SecretToken123"}  # the token of the composition's Secret was sent


def test_offline_mode_asked_for_refuses_an_uncached_model_without_asking_the_hub(hub, monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelLoadError) as caught:
        snapshot("org/anything", "main")
    assert caught.value.reason == "ModelNotCached" and "offline: true" in caught.value.message
    assert not [path for path, _ in FakeHub.seen if path.startswith("/api/models/")]


def test_a_gated_model_makes_the_elasticmodel_degraded_with_the_hubs_reason(hub):
    with pytest.raises(ModelLoadError) as caught:
        snapshot("org/gated", "main")
    chat = dataclasses.replace(MODEL, model="org/gated")
    verdict = WorkerVerdict(mode="resident", verdict="refused", slot=RESIDENT.slot, reason=caught.value.reason,
                            message=caught.value.message)
    observed = dataclasses.replace(ALL_GOOD, verdict=verdict)
    conditions = conditions_for(chat, RESIDENT, None, None, observed, [], "2026-11-30T17:00:00Z")
    degraded = next(c for c in conditions if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "HubAccessDenied")
    assert GATED.rstrip(".") in degraded["message"] and "hfTokenSecret" in degraded["message"]


def test_byte_progress_is_logged_in_gib_with_the_share_done(caplog):
    bar = type("P", (ByteProgress,), {"model": "org/m@main"})(total=4 << 30, unit="B")
    with caplog.at_level(logging.INFO, logger="worker.download"):
        bar.update(1 << 30)  # the first update logs; the next within LOG_EVERY_S does not, the last does
        bar.update(1 << 30)
        bar.update(2 << 30)
    assert [r.getMessage() for r in caplog.records] == [
        "org/m@main: downloaded 1.00 GiB of 4.00 GiB (25%)", "org/m@main: downloaded 4.00 GiB of 4.00 GiB (100%)"]
    assert progress_line(5 << 29, 0) == "downloaded 2.50 GiB"


def test_an_unreachable_hub_is_named_as_such(hub, monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")  # discard port: refused
    with pytest.raises(ModelLoadError) as caught:
        snapshot("org/anything", "main")
    assert caught.value.reason == "HubUnreachable" and "egress" in caught.value.message
