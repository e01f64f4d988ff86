"""Kubernetes object names: DNS-1123 labels, made deterministic from arbitrary parts.

Owns every name compose gives an object (workers, Services, profiler Jobs, the
profile ConfigMap a profiler writes) and the checks that a name or label value is
safe to use as-is. Called by controller.rendering.compose; the profile ConfigMap name is
also what the profile loader looks for.
"""
from __future__ import annotations

import hashlib
import re

from controller.types import GpuSlot

MAX_LABEL = 63
HASH_CHARS = 8
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_INVALID_RUN = re.compile(r"[^a-z0-9]+")


def is_dns_label(text: str) -> bool:
    """True for a DNS-1123 label: lowercase alphanumerics and '-', at most 63 characters."""
    return len(text) <= MAX_LABEL and bool(_DNS_LABEL.match(text))


def is_label_value(text: str) -> bool:
    """True for a valid Kubernetes label value (at most 63 characters, alphanumeric ends)."""
    return len(text) <= MAX_LABEL and bool(_LABEL_VALUE.match(text))


def digest(*parts: str) -> str:
    """A short, stable hex digest of the parts (a NUL separator keeps ("a", "bc") and ("ab", "c") apart)."""
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:HASH_CHARS]


def dns_label(*parts: str) -> str:
    """Join the parts with '-' into a DNS-1123 label.

    When the join is already a valid label it is returned as-is (so join only parts
    whose boundaries cannot shift, or use keyed_label); when sanitising changed it
    (case, dots, slashes) or it is longer than 63 characters, it is cut and a hash of
    the original parts appended, so two inputs that sanitise alike stay apart.
    """
    raw = "-".join(parts)
    if is_dns_label(raw):
        return raw
    return keyed_label(parts, key=parts)


def keyed_label(readable: tuple[str, ...], key: tuple[str, ...]) -> str:
    """A DNS-1123 label: the sanitised readable parts, cut to fit, then a hash of `key`."""
    clean = _INVALID_RUN.sub("-", "-".join(readable).lower()).strip("-")
    head = clean[: MAX_LABEL - HASH_CHARS - 1].rstrip("-") or "x"
    return f"{head}-{digest(*key)}"


def worker_name(slot: GpuSlot, composition: str) -> str:
    """The worker (Deployment, ConfigMap, pod label) of one GPU slot under one composition."""
    return dns_label("worker", slot.node, f"gpu{slot.index}", composition)


def service_name(namespace: str, name: str) -> str:
    """The Service that routes one ElasticModel's traffic. It lives in the shared worker namespace, so the
    hash keeps llm/a-b and llm-a/b apart even though both read `llm-a-b`."""
    return keyed_label((namespace, name), key=(namespace, name))


def profile_configmap_name(model: str, revision: str, gpu_product: str) -> str:
    """The ConfigMap a profiler Job writes the profile of (model, revision, product) into."""
    return keyed_label(("profile", _tail(model), gpu_product), key=(model, revision, gpu_product))


def profiler_job_name(model: str, revision: str, gpu_product: str, profiler_version: str) -> str:
    """A Job name unique per (model, revision, GPU product, profiler version).

    Jobs are immutable: a new profiler image gets a new name instead of a patch that
    the API server would refuse.
    """
    return keyed_label(("profile", _tail(model), gpu_product), key=(model, revision, gpu_product, profiler_version))


def _tail(model: str) -> str:
    """The readable end of a hub id or path: `Qwen/Qwen2.5-0.5B` → `Qwen2.5-0.5B`."""
    return model.rstrip("/").rsplit("/", 1)[-1]
