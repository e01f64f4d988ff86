"""Model files from the Hugging Face Hub into the worker's cache, on first use.

Owns fetching a hub id's snapshot (config, weights, tokenizer) into HF_HOME (the
composition's model cache at /cache), offline only when HF_HUB_OFFLINE asks for it,
with the token the hub client reads from HF_TOKEN (never logged), logging byte progress,
and turning the Hub's refusals into a ModelLoadError whose reason says what to fix and
whose message carries the Hub's own words: the worker's refused verdict, which the
controller shows as the ElasticModel's Degraded condition. Called by worker.loader.resolve.
"""
from __future__ import annotations

import io
import logging
import time
from collections.abc import Callable
from pathlib import Path

from tqdm.std import tqdm

from .errors import ModelLoadError

log = logging.getLogger("worker.download")
# What the worker reads: config, safetensors weights (and their index), tokenizer and generation files.
FILES = ["*.json", "*.safetensors", "*.model", "*.tiktoken", "*.txt"]
LOG_EVERY_S = 5.0
GIB = 1 << 30


class ByteProgress(tqdm):
    """A progress bar that draws nothing and logs bytes: at most every LOG_EVERY_S seconds, and when done."""

    model = ""  # set per download by a subclass (see snapshot)

    def __init__(self, *args, **kwargs):
        kwargs["file"] = io.StringIO()
        super().__init__(*args, **kwargs)
        self._logged_at = float("-inf")

    def update(self, n: float | None = 1) -> bool | None:
        shown = super().update(n)
        now = time.monotonic()
        finished = bool(self.total) and self.n >= self.total
        if self.unit == "B" and self.n and (finished or now - self._logged_at >= LOG_EVERY_S):
            self._logged_at = now
            log.info("%s: %s", self.model, progress_line(int(self.n), int(self.total or 0)))
        return shown


def progress_line(done: int, total: int) -> str:
    """`1.25 GiB of 15.00 GiB (8%)`; the total is unknown (0) until the file list is read."""
    if total <= 0:
        return f"downloaded {done / GIB:.2f} GiB"
    return f"downloaded {done / GIB:.2f} GiB of {total / GIB:.2f} GiB ({100 * done // total}%)"


def snapshot(model_id: str, revision: str, *, download: Callable[..., str] | None = None) -> Path:
    """The local directory of `model_id@revision`, downloaded into the hub cache unless it is there."""
    if download is None:
        from huggingface_hub import snapshot_download as download
    progress = type("ModelByteProgress", (ByteProgress,), {"model": f"{model_id}@{revision}"})
    try:
        return Path(download(model_id, revision=revision, allow_patterns=FILES, tqdm_class=progress))
    except Exception as exc:  # noqa: BLE001 - every hub failure becomes a typed refusal; others propagate
        refusal = hub_refusal(exc, model_id, revision)
        if refusal is None:
            raise
        raise refusal from exc


def hub_refusal(exc: BaseException, model_id: str, revision: str) -> ModelLoadError | None:
    """The refusal a hub client exception means (the Hub's reason kept), or None when it is not one."""
    from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError,
                                        RepositoryNotFoundError, RevisionNotFoundError)

    said = _hub_says(exc)
    ref = f"{model_id}@{revision}"
    if isinstance(exc, GatedRepoError) or (isinstance(exc, HfHubHTTPError) and _status(exc) in (401, 403)
                                           and not isinstance(exc, RepositoryNotFoundError)):
        return ModelLoadError("HubAccessDenied", f"{ref}: the Hub refused access: {said}; accept the model's "
                              "licence with the account whose token the composition's hfTokenSecret holds, or "
                              "set hfTokenSecret")
    if isinstance(exc, RevisionNotFoundError):
        return ModelLoadError("HubRevisionNotFound", f"{ref}: the Hub has no such revision: {said}; set "
                              "spec.revision to an existing branch, tag or commit")
    if isinstance(exc, RepositoryNotFoundError):
        return ModelLoadError("HubModelNotFound", f"{ref}: the Hub has no such model, or it is private: {said}; "
                              "check spec.model, or set the composition's hfTokenSecret for a private model")
    if isinstance(exc, LocalEntryNotFoundError):
        cause = exc.__cause__ or exc.__context__  # the hub call that failed before the cache was tried
        if isinstance(cause, HfHubHTTPError):
            return hub_refusal(cause, model_id, revision)
        from huggingface_hub import constants

        if constants.HF_HUB_OFFLINE:
            return ModelLoadError("ModelNotCached", f"{ref} is not in the model cache and downloads are off "
                                  f"(the composition sets offline: true): {said}; pre-fetch it into the cache, "
                                  "or set offline: false")
        return ModelLoadError("HubUnreachable", f"{ref} is not in the model cache and the Hub could not be reached "
                              f"({_hub_says(cause) if cause else said}); allow the worker's egress to the Hub, or "
                              "pre-fetch the model into the cache")
    if isinstance(exc, HfHubHTTPError):
        return ModelLoadError("HubDownloadFailed", f"{ref}: downloading from the Hub failed: {said}; the worker "
                              "retries on its next start")
    return None


def _hub_says(exc: BaseException) -> str:
    """The Hub's own reason: its X-Error-Message header when the response carries one, else the first line."""
    response = getattr(exc, "response", None)
    message = response.headers.get("X-Error-Message") if response is not None else None
    text = message or (str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    return text.rstrip(".")


def _status(exc: BaseException) -> int | None:
    return getattr(getattr(exc, "response", None), "status_code", None)
