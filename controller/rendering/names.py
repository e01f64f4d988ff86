"""Kubernetes object names: DNS-1123 labels, made deterministic from arbitrary parts.

Owns every name compose gives an object (workers, Services, profiler Jobs, the
profile ConfigMap a profiler writes) and the checks that a name or label value is
safe to use as-is. Called by controller.rendering.compose; the profile ConfigMap name is
also what the profile loader looks for.
"""
from __future__ import annotations

import hashlib
import re

from controller.inputs.kube_rules import MAX_LABEL, is_dns_label
from controller.types import GpuSlot

HASH_CHARS = 8
_INVALID_RUN = re.compile(r"[^a-z0-9]+")


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


def keyed_label(readable: tuple[str, ...], key: tuple[str, ...], *, letter_first: bool = False) -> str:
    """A DNS-1123 label: the sanitised readable parts, cut to fit, then a hash of `key`. `letter_first`: a
    DNS-1035 label (a Service name), so a head that starts with a digit gets an `m-` in front."""
    clean = _INVALID_RUN.sub("-", "-".join(readable).lower()).strip("-")
    if letter_first and not clean[:1].isalpha():
        clean = f"m-{clean}"
    head = clean[: MAX_LABEL - HASH_CHARS - 1].rstrip("-") or "x"
    return f"{head}-{digest(*key)}"


def worker_name(slot: GpuSlot, composition: str) -> str:
    """The worker (Deployment, ConfigMap, pod label) of one GPU slot under one composition."""
    return dns_label("worker", slot.node, f"gpu{slot.index}", composition)


def service_name(namespace: str, name: str) -> str:
    """The Service that routes one ElasticModel's traffic. It lives in the shared worker namespace, so the
    hash keeps llm/a-b and llm-a/b apart even though both read `llm-a-b`. A DNS-1035 label, as Service names
    must be: a namespace that starts with a digit gets an `m-` in front."""
    return keyed_label((namespace, name), key=(namespace, name), letter_first=True)


def profile_configmap_name(model: str, revision: str, gpu_product: str, weight_dtype: str = "auto") -> str:
    """The ConfigMap a profiler Job writes the profile of (model, revision, product, weight dtype) into (the
    dtype joins the name and its hash only when it is not auto, so the names of earlier profiles stay)."""
    dtype = () if weight_dtype == "auto" else (weight_dtype,)
    return keyed_label(("profile", _tail(model), gpu_product, *dtype), key=(model, revision, gpu_product, *dtype))


def profiler_job_name(model: str, revision: str, gpu_product: str, profiler_version: str, concurrency: int,
                      context_tokens: int, weight_dtype: str = "auto") -> str:
    """A Job name unique per (model, revision, GPU product, profiler version, measured concurrency and context,
    weight dtype when not auto).

    Jobs are immutable: a new profiler image or another `--concurrency`, `--context-tokens` or `--weights`
    gets a new name instead of a patch that the API server would refuse.
    """
    dtype = () if weight_dtype == "auto" else (weight_dtype,)
    return keyed_label(("profile", _tail(model), gpu_product, *dtype),
                       key=(model, revision, gpu_product, profiler_version, str(concurrency), str(context_tokens),
                            *dtype))


def _tail(model: str) -> str:
    """The readable end of a hub id or path: `Qwen/Qwen2.5-0.5B` → `Qwen2.5-0.5B`."""
    return model.rstrip("/").rsplit("/", 1)[-1]
