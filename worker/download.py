"""Model files from the Hugging Face Hub into the worker's cache, on first use: the worker's side of contract.hub.

contract.hub downloads (offline only when HF_HUB_OFFLINE asks, the token from HF_TOKEN, never logged) and
classifies the Hub's refusals; here its progress lines go to the `worker.download` logger and a refusal
becomes a ModelLoadError with the same reason and message: the worker's refused verdict, which the
controller shows as the ElasticModel's Degraded condition. Called by worker.loader.resolve.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from contract import hub

from .errors import ModelLoadError

log = logging.getLogger("worker.download")


def snapshot(model_id: str, revision: str, *, download: Callable[..., str] | None = None) -> Path:
    """The local directory of `model_id@revision`, downloaded into the hub cache unless it is there."""
    try:
        return hub.snapshot(model_id, revision, report=log.info, download=download)
    except hub.HubError as exc:
        raise ModelLoadError(exc.reason, exc.message) from exc
