"""Model files from the Hugging Face Hub into the model cache: the one download the worker and the profiler share.

Owns fetching a hub id's snapshot (config, weights, tokenizer) into the hub cache under HF_HOME (the
composition's model cache at /cache), offline only when HF_HUB_OFFLINE asks for it, with the token the
hub client reads from HF_TOKEN (the composition's hfTokenSecret; never logged); byte progress, reported
as one line (`org/m@main: downloaded 1.25 GiB of 15.00 GiB (8%)`) at most every LOG_EVERY_S seconds and
when done; and the Hub's refusals, turned into a HubError whose PascalCase reason says what to fix and
whose message carries the Hub's own words.

Called by worker.download (a refusal becomes the worker's refused verdict) and profiler_job.load (a
refusal becomes the Job's exit code and termination line `<Reason>: <message>`, which
controller.observe.facts reads back with `termination_reason`); the controller shows either as the
ElasticModel's Degraded condition with the same reason. huggingface_hub and tqdm are imported only when
a download runs, so the controller can import the reasons.
"""
from __future__ import annotations

import io
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

# What the worker and the profiler read: config, safetensors weights (and their index), tokenizer and
# generation files. The profiler adds REMOTE_CODE_FILES when it is asked to trust the repository's code.
FILES = ("*.json", "*.safetensors", "*.model", "*.tiktoken", "*.txt")
REMOTE_CODE_FILES = ("*.py",)
LOG_EVERY_S = 5.0
# huggingface_hub 2.x passes two byte bars: the bytes written (the files' sizes) and the network bytes received
# ("Downloading bytes", with a total it guesses); only the first is reported, so each byte is counted once.
TRANSFER_BAR = "Downloading bytes"
GIB = 1 << 30

ACCESS_DENIED = "HubAccessDenied"
MODEL_NOT_FOUND = "HubModelNotFound"
REVISION_NOT_FOUND = "HubRevisionNotFound"
NOT_CACHED = "ModelNotCached"
UNREACHABLE = "HubUnreachable"
DOWNLOAD_FAILED = "HubDownloadFailed"
REASONS = frozenset({ACCESS_DENIED, MODEL_NOT_FOUND, REVISION_NOT_FOUND, NOT_CACHED, UNREACHABLE, DOWNLOAD_FAILED})

Report = Callable[[str], None]
"""Hears each progress line; the worker logs it, the profiler writes it as a JSON log line."""


class HubError(Exception):
    """The Hub refused or could not serve a model: `reason` (one of REASONS) and a message with the fix."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


def progress_line(done: int, total: int) -> str:
    """`downloaded 1.25 GiB of 15.00 GiB (8%)`; the total is unknown (0) until the file list is read."""
    if total <= 0:
        return f"downloaded {done / GIB:.2f} GiB"
    return f"downloaded {done / GIB:.2f} GiB of {total / GIB:.2f} GiB ({100 * done // total}%)"


def byte_progress(model: str, report: Report) -> type:
    """A tqdm class for huggingface_hub's `tqdm_class` that draws nothing and reports the bytes written as
    `<model>: <progress_line>`: at most every LOG_EVERY_S seconds, and when the bar is full (again at most
    every LOG_EVERY_S: the Hub's total grows file by file, so it fills after each). Its bars share one
    state (the class: one per download); `final()` is the line for the last state when it was not reported.
    `model` and `report` are class attributes, so a subclass may set another model."""
    from tqdm.std import tqdm

    class ByteProgress(tqdm):
        reported_at = finished_at = float("-inf")
        state: tuple[int, int] | None = None  # (bytes, total) of the last update
        shown: tuple[int, int] | None = None  # the last state reported

        def __init__(self, *args, **kwargs):
            kwargs["file"] = io.StringIO()
            super().__init__(*args, **kwargs)
            self.counted = self.unit == "B" and self.desc != TRANSFER_BAR

        def update(self, n: float | None = 1) -> bool | None:
            drawn = super().update(n)
            if self.counted and self.n:
                self._heard(int(self.n), int(self.total or 0), time.monotonic())
            return drawn

        @classmethod
        def _heard(cls, done: int, total: int, now: float) -> None:
            cls.state = (done, total)
            if total and done >= total and now - cls.finished_at >= LOG_EVERY_S:
                cls.finished_at = cls.reported_at = now
            elif now - cls.reported_at >= LOG_EVERY_S:
                cls.reported_at = now
            else:
                return
            cls.shown = cls.state
            cls.report(f"{cls.model}: {progress_line(done, total)}")

        @classmethod
        def final(cls) -> str | None:
            if cls.state is None or cls.state == cls.shown:
                return None
            return f"{cls.model}: {progress_line(*cls.state)}"

    ByteProgress.model = model
    ByteProgress.report = staticmethod(report)
    return ByteProgress


def snapshot(model_id: str, revision: str, *, report: Report, download: Callable[..., Any] | None = None,
             patterns: Sequence[str] = FILES) -> Path:
    """The local directory of `model_id@revision`, downloaded into the hub cache unless it is there.

    `download` is huggingface_hub's `snapshot_download` unless a test passes its own (same keywords:
    revision, allow_patterns, tqdm_class). A refusal of the Hub raises HubError; other errors propagate."""
    if download is None:
        from huggingface_hub import snapshot_download as download
    progress = byte_progress(f"{model_id}@{revision}", report)
    try:
        directory = Path(download(model_id, revision=revision, allow_patterns=list(patterns), tqdm_class=progress))
    except Exception as exc:  # noqa: BLE001 - every hub failure becomes a typed refusal; others propagate
        refusal = hub_refusal(exc, model_id, revision)
        if refusal is None:
            raise
        raise refusal from exc
    if (line := progress.final()) is not None:
        report(line)
    return directory


def hub_refusal(exc: BaseException, model_id: str, revision: str) -> HubError | None:
    """The refusal a hub client exception means (the Hub's reason kept), or None when it is not one."""
    from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError,
                                        RepositoryNotFoundError, RevisionNotFoundError)

    said = _hub_says(exc)
    ref = f"{model_id}@{revision}"
    if isinstance(exc, GatedRepoError) or (isinstance(exc, HfHubHTTPError) and _status(exc) in (401, 403)
                                           and not isinstance(exc, RepositoryNotFoundError)):
        return HubError(ACCESS_DENIED, f"{ref}: the Hub refused access: {said}; accept the model's licence with "
                        "the account whose token the composition's hfTokenSecret holds, or set hfTokenSecret")
    if isinstance(exc, RevisionNotFoundError):
        return HubError(REVISION_NOT_FOUND, f"{ref}: the Hub has no such revision: {said}; set spec.revision to an "
                        "existing branch, tag or commit")
    if isinstance(exc, RepositoryNotFoundError):
        return HubError(MODEL_NOT_FOUND, f"{ref}: the Hub has no such model, or it is private: {said}; check "
                        "spec.model, or set the composition's hfTokenSecret for a private model")
    if isinstance(exc, LocalEntryNotFoundError):
        cause = exc.__cause__ or exc.__context__  # the hub call that failed before the cache was tried
        if isinstance(cause, HfHubHTTPError):
            return hub_refusal(cause, model_id, revision)
        from huggingface_hub import constants

        if constants.HF_HUB_OFFLINE:
            return HubError(NOT_CACHED, f"{ref} is not in the model cache and downloads are off (the composition "
                            f"sets offline: true): {said}; pre-fetch it into the cache, or set offline: false")
        return HubError(UNREACHABLE, f"{ref} is not in the model cache and the Hub could not be reached "
                        f"({_hub_says(cause) if cause else said}); allow the pod's egress to the Hub, or pre-fetch "
                        "the model into the cache")
    if isinstance(exc, HfHubHTTPError):
        return HubError(DOWNLOAD_FAILED, f"{ref}: downloading from the Hub failed: {said}; the worker retries on "
                        "its next start, a profiler Job on its next attempt")
    return None


def looks_like_path(model_id: str) -> bool:
    """Whether a spec.model names a local path (absolute, ./, ../ or ~), never a hub id: a path that is not on the
    node is unreadable, not something to ask the Hub for."""
    return model_id.startswith(("/", "./", "../", "~")) or Path(model_id).is_absolute()


def termination_reason(line: str) -> str | None:
    """The Hub reason a failed profiler Job's termination line `<Reason>: <message>` starts with, or None."""
    reason = line.partition(": ")[0]
    return reason if reason in REASONS else None


def _hub_says(exc: BaseException) -> str:
    """The Hub's own reason: its X-Error-Message header when the response carries one, else the first line."""
    response = getattr(exc, "response", None)
    message = response.headers.get("X-Error-Message") if response is not None else None
    text = message or (str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    return text.rstrip(".")


def _status(exc: BaseException) -> int | None:
    return getattr(getattr(exc, "response", None), "status_code", None)
