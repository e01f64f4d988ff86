"""Publishing a profile: to a ConfigMap through the official kubernetes client, or to a file.

Owns the ConfigMap's shape (data key `profile.yaml`; labels
`gpushare.dev/profile: "true"`, `gpushare.dev/gpu-product`, `gpushare.dev/model-hash`;
the full model id and revision as annotations), create-or-patch on 409, and the
typed errors for 403 (ConfigMapForbidden) and other API failures. The Job's Role
needs `create` and `patch` on configmaps in that one namespace, nothing else.
Called by profiler_job.cli; `model_hash` and the label names are what the
controller selects profile ConfigMaps by. Imports neither torch nor transformers.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from contract import kube
from contract.wire import (MANAGED_BY_LABEL, MODEL_ANNOTATION, PROFILE_DATA_KEY, PROFILE_GPU_PRODUCT_LABEL,
                           PROFILE_LABEL, PROFILE_MODEL_HASH_LABEL, REVISION_ANNOTATION)
from profiler_job.args import ConfigMapTarget, FileTarget, Target
from profiler_job.errors import ConfigMapForbidden, PublishFailed

MODEL_HASH_CHARS = 16


def model_hash(model: str, revision: str) -> str:
    """A label-safe hash (16 hex characters) of model id and revision: `model@revision`."""
    return hashlib.sha256(f"{model}@{revision}".encode()).hexdigest()[:MODEL_HASH_CHARS]


def profile_yaml(profile: dict) -> str:
    return yaml.safe_dump(profile, sort_keys=False)


def configmap_body(target: ConfigMapTarget, profile: dict) -> dict:
    revision = profile.get("revision", "main")
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": target.name,
            "namespace": target.namespace,
            "labels": {
                PROFILE_LABEL: "true",
                PROFILE_GPU_PRODUCT_LABEL: profile["gpu"]["product"],
                PROFILE_MODEL_HASH_LABEL: model_hash(profile["model"], revision),
                MANAGED_BY_LABEL: "gpushare-profiler",
            },
            "annotations": {MODEL_ANNOTATION: profile["model"], REVISION_ANNOTATION: revision},
        },
        "data": {PROFILE_DATA_KEY: profile_yaml(profile)},
    }


def publish(profile: dict, target: Target, core_api: Callable[[], Any]) -> str:
    """Write the profile to `target`; returns where it went. `core_api` builds a kubernetes CoreV1Api."""
    if isinstance(target, FileTarget):
        write_file(Path(target.path), profile_yaml(profile))
        return f"file:{target.path}"
    write_configmap(_connect(core_api), configmap_body(target, profile))
    return f"configmap:{target.namespace}/{target.name}"


def write_file(path: Path, text: str) -> None:
    """Atomic: a reader never sees half a profile."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _connect(core_api: Callable[[], Any]) -> Any:
    from kubernetes.config import ConfigException

    try:
        return core_api()
    except ConfigException as exc:
        raise PublishFailed(f"no Kubernetes credentials ({exc}); run the Job with a ServiceAccount, "
                            "or use --out file:PATH") from exc


def write_configmap(api: Any, body: dict) -> None:
    """Create the ConfigMap; when it exists (409), merge-patch it (labels, annotations and profile.yaml)."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    try:
        kube.write_configmap(api, body)
    except ApiException as exc:
        if exc.status in (401, 403):
            raise ConfigMapForbidden(
                f"the API server refused to write ConfigMap {namespace}/{name} (HTTP {exc.status}); bind the Job's "
                f"ServiceAccount to a Role allowing create and patch on configmaps in namespace {namespace}") from exc
        raise PublishFailed(
            f"writing ConfigMap {namespace}/{name} failed (HTTP {exc.status} {exc.reason}); "
            "check the API server and retry the Job") from exc
    except HTTPError as exc:
        raise PublishFailed(f"the API server did not answer while writing ConfigMap {namespace}/{name} ({exc}); "
                            "check the network to the API server and retry the Job") from exc


def default_core_api() -> Any:
    """CoreV1Api from the in-cluster ServiceAccount, else from the local kubeconfig."""
    return kube.core_v1()
