"""The profiler downloads a hub model as the worker does (contract.hub): into the model cache, byte progress logged in
the worker's words, the token sent and never logged, offline only when asked; a gated, missing or unknown-revision
model fails the Job with the worker's reason and the Hub's words, and that reason becomes the ElasticModel's Degraded
reason. Two doubles: a download function passed in, and huggingface_hub's own client against a Hub double on
127.0.0.1 (tests/hubdouble.py)."""
from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import httpx2
import huggingface_hub.constants
import pytest
import yaml
from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, RepositoryNotFoundError,
                                    RevisionNotFoundError)

from contract import hub as contract_hub
from controller.observe.facts import job_state
from controller.observe.status import Observed, conditions_for
from profiler_job import errors
from profiler_job.cli import main
from profiler_job.run import Adapters
from tests.hubdouble import GATED, TOKEN, hub  # noqa: F401 - hub is a fixture
from tests.test_status import MODEL, PENDING
from tests.tinymodels import save_tiny_model
from worker.download import snapshot as worker_snapshot
from worker.errors import ModelLoadError

FAST = ["--gpu-product", "Tesla T4", "--context-tokens", "32", "--repeats", "2"]
GIB = 1 << 30


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("hub-model") / "tiny", "llama")


def run(model: str, tmp_path: Path, adapters: Adapters, *extra: str) -> tuple[int, dict | None, str | None, list[dict]]:
    """(exit code, profile or None, termination line or None, the JSON log records)."""
    out, log, stderr = tmp_path / "profile.yaml", tmp_path / "termination-log", io.StringIO()
    code = main(["--model", model, *FAST, *extra, "--out", f"file:{out}", "--termination-log", str(log)],
                adapters=adapters, stderr=stderr, tty=False)
    records = [json.loads(line) for line in stderr.getvalue().splitlines()]
    return (code, yaml.safe_load(out.read_text()) if out.exists() else None,
            log.read_text().strip() if log.exists() else None, records)


class FakeDownload:
    """snapshot_download's shape: reports 3 GiB in 1 GiB steps on a byte bar (and noise on a file-count bar), then
    answers the directory of the tiny model; records what it was asked."""

    def __init__(self, directory: Path):
        self.directory, self.calls = directory, []

    def __call__(self, model_id, *, revision, allow_patterns, tqdm_class):
        self.calls.append((model_id, revision, tuple(allow_patterns)))
        files = tqdm_class(total=2, unit="it")  # huggingface_hub's "Fetching 2 files": not bytes, not reported
        written = tqdm_class(total=3 * GIB, unit="B")
        for _ in range(3):
            written.update(GIB)
            files.update(1)
        return str(self.directory)


def _progress(records: list[dict]) -> list[str]:
    return [r["message"] for r in records if r.get("event") == "progress"]


def test_a_hub_model_is_downloaded_with_progress_then_profiled_from_the_cache(tiny, tmp_path):
    download = FakeDownload(tiny)
    code, profile, line, records = run("org/tiny", tmp_path, Adapters(cuda_available=lambda: False,
                                                                       download=download))
    assert (code, line) == (0, None)
    assert profile["model"] == "org/tiny" and profile["revision"] == "main"
    assert download.calls == [("org/tiny", "main", contract_hub.FILES)]
    # the first update and the full bar, in the worker's words, within the load stage and before it is done
    assert _progress(records) == ["org/tiny@main: downloaded 1.00 GiB of 3.00 GiB (33%)",
                                  "org/tiny@main: downloaded 3.00 GiB of 3.00 GiB (100%)"]
    assert {r["stage"] for r in records if r.get("event") == "progress"} == {"load"}
    assert [r["stage"] for r in records].index("weights") > max(
        i for i, r in enumerate(records) if r.get("event") == "progress")


def test_on_a_terminal_the_progress_lines_are_printed_above_the_bar(tiny, tmp_path):
    stderr = io.StringIO()
    code = main(["--model", "org/tiny", *FAST, "--out", f"file:{tmp_path / 'p.yaml'}", "--termination-log",
                 str(tmp_path / "log")], adapters=Adapters(cuda_available=lambda: False, download=FakeDownload(tiny)),
                stderr=stderr, tty=True)
    assert code == 0
    printed = stderr.getvalue()
    assert "org/tiny@main: downloaded 1.00 GiB of 3.00 GiB (33%)\n" in printed and "{" not in printed


def test_trusting_remote_code_also_downloads_the_repositorys_python_files(tiny, tmp_path):
    download = FakeDownload(tiny)
    run("org/tiny", tmp_path, Adapters(cuda_available=lambda: False, download=download), "--trust-remote-code")
    assert download.calls[0][2] == (*contract_hub.FILES, "*.py")


def test_a_local_directory_is_loaded_as_it_is_without_asking_the_hub(tiny, tmp_path):
    download = FakeDownload(tiny)
    code, _, _, records = run(str(tiny), tmp_path, Adapters(cuda_available=lambda: False, download=download))
    assert code == 0 and download.calls == [] and _progress(records) == []


def _refusal(kind: type[HfHubHTTPError], status: int, code: str, words: str) -> HfHubHTTPError:
    request = httpx2.Request("GET", "http://127.0.0.1/api/models/org/m/revision/main")
    response = httpx2.Response(status, request=request, headers={"X-Error-Code": code, "X-Error-Message": words})
    return kind(f"{status} Client Error. (token {TOKEN})", response=response)


def _raising(exc: BaseException):
    def download(*_args, **_kwargs):
        raise exc
    return download


FAKE_REFUSALS = [  # id, what huggingface_hub raised, the reason, the Hub's words the message keeps
    ("gated-401", _refusal(GatedRepoError, 401, "GatedRepo", GATED), errors.HubAccessDenied, GATED.rstrip(".")),
    ("gated-403", _refusal(GatedRepoError, 403, "GatedRepo", GATED), errors.HubAccessDenied, GATED.rstrip(".")),
    ("token-refused-403", _refusal(HfHubHTTPError, 403, "", "Invalid credentials"), errors.HubAccessDenied,
     "Invalid credentials"),
    ("missing-model-404", _refusal(RepositoryNotFoundError, 404, "RepoNotFound", "Repository not found"),
     errors.HubModelNotFound, "Repository not found"),
    ("missing-revision-404", _refusal(RevisionNotFoundError, 404, "RevisionNotFound", "Invalid rev id: v9"),
     errors.HubRevisionNotFound, "Invalid rev id: v9"),
    ("hub-error-500", _refusal(HfHubHTTPError, 500, "", "Internal Error"), errors.HubDownloadFailed,
     "Internal Error"),
]


@pytest.mark.parametrize("raised, error, words", [f[1:] for f in FAKE_REFUSALS], ids=[f[0] for f in FAKE_REFUSALS])
def test_a_refusal_of_the_download_function_is_the_hubs_reason(raised, error, words, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    code, profile, line, records = run("org/m", tmp_path, Adapters(cuda_available=lambda: False,
                                                                    download=_raising(raised)))
    assert (code, profile) == (error.exit_code, None)
    assert line.startswith(f"{error.reason}: org/m@main: ") and words in line
    assert TOKEN not in line + json.dumps(records)
    assert (records[-1]["stage"], records[-1]["reason"]) == ("load", error.reason)


HUB_CASES = [  # id, repository, revision, the reason the worker and the profiler both give
    ("gated-403", "org/gated", "main", contract_hub.ACCESS_DENIED),
    ("gated-401", "org/gated-401", "main", contract_hub.ACCESS_DENIED),
    ("missing-model-404", "org/absent", "main", contract_hub.MODEL_NOT_FOUND),
    ("missing-revision-404", "org/moved", "v9", contract_hub.REVISION_NOT_FOUND),
]


@pytest.mark.parametrize("repo, revision, reason", [c[1:] for c in HUB_CASES], ids=[c[0] for c in HUB_CASES])
def test_the_hubs_refusal_reads_the_same_in_the_profiler_and_in_the_worker(hub, repo, revision, reason, tmp_path):
    code, _, line, records = run(repo, tmp_path, Adapters(cuda_available=lambda: False), "--revision", revision)
    with pytest.raises(ModelLoadError) as worker:
        worker_snapshot(repo, revision)
    assert errors.HUB_ERRORS[reason].exit_code == code
    assert line == f"{reason}: {worker.value.message}" and worker.value.reason == reason
    assert set(hub.asked(repo)) == {f"Bearer {TOKEN}"} and TOKEN not in line + json.dumps(records)


def test_a_model_the_hub_serves_is_profiled_with_its_bytes_counted_once(hub, tiny, tmp_path):
    hub.serve("org/tiny", tiny)
    code, profile, line, records = run("org/tiny", tmp_path, Adapters(cuda_available=lambda: False))
    assert (code, line) == (0, None)
    cached = Path(huggingface_hub.constants.HF_HUB_CACHE) / "models--org--tiny"
    assert profile["model"] == "org/tiny" and cached.is_dir()
    total = sum(p.stat().st_size for p in (tiny).iterdir() if p.name in hub.repos["org/tiny"])
    lines = _progress(records)
    assert lines and lines[-1] == f"org/tiny@main: {contract_hub.progress_line(total, total)}"


def test_offline_mode_asked_for_fails_without_asking_the_hub(hub, monkeypatch, tmp_path):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    code, _, line, _ = run("org/anything", tmp_path, Adapters(cuda_available=lambda: False))
    assert code == errors.ModelNotCached.exit_code and line.startswith("ModelNotCached: ") and "offline" in line
    assert hub.seen == []


def test_every_reason_of_the_shared_module_is_a_profiler_error_with_its_own_exit_code():
    assert set(errors.HUB_ERRORS) == contract_hub.REASONS
    assert all(e in errors.ALL_ERRORS and e.reason == reason for reason, e in errors.HUB_ERRORS.items())


def _failed_job(termination: str) -> tuple[dict, list[dict]]:
    job = {"metadata": {"name": "profile-chat-abc"}, "status": {"conditions": [
        {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "the limit is reached"}]}}
    pod = {"status": {"containerStatuses": [{"state": {"terminated": {
        "exitCode": 4, "message": termination, "finishedAt": "2026-11-30T17:00:00Z"}}}]}}
    return job, [pod]


@pytest.mark.parametrize("repo, revision, reason", [c[1:] for c in HUB_CASES], ids=[c[0] for c in HUB_CASES])
def test_a_profiler_job_the_hub_refused_makes_the_elasticmodel_degraded_with_the_hubs_reason(
        hub, repo, revision, reason, tmp_path):
    _, _, line, _ = run(repo, tmp_path, Adapters(cuda_available=lambda: False), "--revision", revision)
    job = job_state(*_failed_job(line))  # the controller reads the Job and its pod's termination message
    pending = dataclasses.replace(PENDING, model=repo, revision=revision)
    conditions = conditions_for(dataclasses.replace(MODEL, model=repo), None, pending, None,
                                Observed(commit="c0ffee1", job=job), [], "2026-11-30T17:00:00Z")
    by_type = {c["type"]: c for c in conditions}
    assert (by_type["Degraded"]["status"], by_type["Degraded"]["reason"]) == ("True", reason)
    assert by_type["Ready"]["reason"] == reason and by_type["Profiled"]["reason"] == "ProfileFailed"
    assert by_type["Degraded"]["message"] == f"profiler Job profile-chat-abc failed: {line}"


@pytest.mark.parametrize("termination", [
    "OutOfMemory: loading org/m ran out of memory",
    "gated model: accept the licence on the hub",
    "HubAccessDeniedish: not a reason of the Hub",
], ids=["other-profiler-reason", "free-text", "prefix-of-a-reason"])
def test_any_other_profiler_failure_stays_profile_failed(termination):
    job = job_state(*_failed_job(termination))
    conditions = conditions_for(MODEL, None, PENDING, None, Observed(commit="c0ffee1", job=job), [],
                                "2026-11-30T17:00:00Z")
    degraded = next(c for c in conditions if c["type"] == "Degraded")
    assert (degraded["reason"], degraded["message"]) == ("ProfileFailed",
                                                         f"profiler Job profile-chat-abc failed: {termination}")
