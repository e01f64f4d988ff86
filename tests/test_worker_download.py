"""Models download on first use: a gated, missing or unreachable hub model becomes a typed refusal carrying the
Hub's own reason, the worker's verdict says so, and the ElasticModel turns Degraded with that reason. The Hub is a
double on 127.0.0.1 that answers as the real one refuses (status, X-Error-Code, X-Error-Message): no network."""
from __future__ import annotations

import dataclasses
import logging

import huggingface_hub.constants
import pytest

from controller.observe.status import WorkerVerdict, conditions_for
from tests.hubdouble import GATED, TOKEN, hub  # noqa: F401 - hub is a fixture
from tests.test_status import ALL_GOOD, MODEL, RESIDENT
from tests.tinymodels import save_tiny_model
from contract.hub import byte_progress, progress_line
from worker.download import log as download_log
from worker.download import snapshot
from worker.errors import ModelLoadError

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
    assert TOKEN not in caught.value.message
    asked = hub.asked(repo)
    assert asked and set(asked) == {f"Bearer {TOKEN}"}  # the token of the composition's Secret was sent


def test_offline_mode_asked_for_refuses_an_uncached_model_without_asking_the_hub(hub, monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelLoadError) as caught:
        snapshot("org/anything", "main")
    assert caught.value.reason == "ModelNotCached" and "offline: true" in caught.value.message
    assert not hub.seen


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
    bar = byte_progress("org/m@main", download_log.info)(total=4 << 30, unit="B")
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


def test_a_model_downloads_into_the_cache_once_with_byte_progress_logged(hub, tmp_path, caplog):
    hub.serve("org/tiny", save_tiny_model(tmp_path / "tiny", "llama"))
    with caplog.at_level(logging.INFO, logger="worker.download"):
        directory = snapshot("org/tiny", "main")
        again = snapshot("org/tiny", "main")  # in the cache now: nothing downloads, nothing logged
    assert again == directory and str(directory).startswith(str(tmp_path / "cache"))
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in directory.iterdir()}
    total = sum(p.stat().st_size for p in directory.iterdir())
    lines = [r.getMessage() for r in caplog.records if r.name == "worker.download"]
    assert lines and all(line.startswith("org/tiny@main: downloaded ") for line in lines)
    assert lines[-1] == f"org/tiny@main: {progress_line(total, total)}"  # every byte counted once: 100%, not 200%
    assert len([line for line in lines if line.endswith("(100%)")]) <= 2  # at most every 5 s, then the last state
    assert set(hub.asked("org/tiny")) == {f"Bearer {TOKEN}"} and TOKEN not in caplog.text
