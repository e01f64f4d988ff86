"""Where a composition's model cache may live on a node: hostPath only under the install's cache root.

Owns the one rule that keeps a composition (a repository's, or the shipped one with the install's
parameters) from mounting a node directory outside the directory the platform team set aside for
model caches: `modelCache.hostPath` must be the root or below it. Without it a repository could
mount the node's /etc read-write and have the root `cache-owner` init container hand it to the
worker's user. The root is the install's setting GPUSHARE_HOST_PATH_ROOT (default /var/lib/gpushare).
Pure; `gpushare validate` (through controller.inputs.compositions.parse_composition) and the
pass (controller.rendering.compose, for every composition a model uses) both call `host_path_problem`.
"""
from __future__ import annotations

import os
import posixpath
from collections.abc import Mapping

HOST_PATH_ROOT_SETTING = "GPUSHARE_HOST_PATH_ROOT"
DEFAULT_HOST_PATH_ROOT = "/var/lib/gpushare"
REASON = "HostPathOutsideRoot"


def host_path_root(environ: Mapping[str, str] = os.environ) -> str:
    """The install's cache root (GPUSHARE_HOST_PATH_ROOT), normalised; an unset, empty or relative value
    is the default root (never the whole filesystem)."""
    value = environ.get(HOST_PATH_ROOT_SETTING, "").strip()
    if not value.startswith("/") or posixpath.normpath(value) == "/":
        return DEFAULT_HOST_PATH_ROOT
    return posixpath.normpath(value)


def host_path_problem(parameters: Mapping[str, object], root: str) -> tuple[str, str] | None:
    """(message, fix) when the composition's modelCache is a hostPath outside `root`; None when it is allowed."""
    cache = parameters.get("modelCache")
    if not isinstance(cache, Mapping) or "hostPath" not in cache:
        return None
    path = str(cache["hostPath"])
    normal = posixpath.normpath(path)
    if normal == root or normal.startswith(root.rstrip("/") + "/"):
        return None
    return (f"modelCache.hostPath {path!r} is outside the install's cache root {root!r}, so the node directory "
            "would be mounted read-write into workers and handed to their user",
            f"use a directory under {root} (e.g. {root}/models), a claimName or null; the platform team sets "
            f"the root with {HOST_PATH_ROOT_SETTING}")
