"""Which workers a commit restarts and which reconfigure in place (terraform-style "1 restart · 2 in place").

A worker's Deployment rolls only when its pod template changes (image, resources, GPU
share, volumes); a changed worker.yaml alone reaches the running worker through its
mounted ConfigMap and is applied in place. Pure: compares the previous rendered tree's
worker Deployments and ConfigMaps with the new ones. Called by controller.rendering.compose
for PLAN.md (its summary and its workers line) and by controller.passes.reconcile for the commit message.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import yaml

WORKER_LABEL = ("app.kubernetes.io/name", "gpushare-worker")
LINE_PREFIX = "Workers: "


@dataclass(frozen=True)
class Rollouts:
    restart: tuple[str, ...] = ()
    in_place: tuple[str, ...] = ()
    new: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()

    @property
    def any(self) -> bool:
        return bool(self.restart or self.in_place or self.new or self.removed)

    @property
    def summary(self) -> str:
        """`1 restart · 2 in place` (new and removed workers only when there are some)."""
        return " · ".join([f"{len(self.restart)} restart", f"{len(self.in_place)} in place", *self._others()])

    @property
    def plan_words(self) -> str:
        """PLAN.md's summary part: `1 worker restarting, 2 in place` (new and removed only when there are some)."""
        n = len(self.restart)
        return ", ".join([f"{n} worker{'s' * (n != 1)} restarting", f"{len(self.in_place)} in place", *self._others()])

    def _others(self) -> list[str]:
        return [f"{len(names)} {what}" for what, names in (("new", self.new), ("removed", self.removed)) if names]

    @property
    def line(self) -> str:
        """The PLAN.md line: the summary, then which worker is which."""
        named = [f"{what}: {', '.join(names)}" for what, names in
                 (("restart", self.restart), ("in place", self.in_place), ("new", self.new),
                  ("removed", self.removed)) if names]
        return f"{LINE_PREFIX}{self.summary} ({'; '.join(named)})."


def _workers(files: Mapping[str, str]) -> dict[str, tuple[dict, str | None]]:
    """worker name -> (pod template, the text of the ConfigMap it mounts)."""
    by_path = {p: t for p, t in files.items() if "/deployment-" in p or "/configmap-" in p}
    out = {}
    for path, text in by_path.items():
        if "/deployment-" not in path:
            continue
        doc = yaml.safe_load(text)
        labels = ((doc or {}).get("metadata") or {}).get("labels") or {}
        if labels.get(WORKER_LABEL[0]) != WORKER_LABEL[1]:
            continue
        template = doc["spec"]["template"]
        mounted = [v["configMap"]["name"] for v in template["spec"].get("volumes", []) if "configMap" in v]
        folder = path.rsplit("/", 1)[0]
        config = next((by_path.get(f"{folder}/configmap-{name}.yaml") for name in mounted), None)
        out[doc["metadata"]["name"]] = (template, config)
    return out


def worker_rollouts(previous: Mapping[str, str], current: Mapping[str, str]) -> Rollouts:
    before, after = _workers(previous), _workers(current)
    restart, in_place = [], []
    for name in sorted(set(before) & set(after)):
        (old_template, old_config), (new_template, new_config) = before[name], after[name]
        if old_template != new_template:
            restart.append(name)
        elif old_config != new_config:
            in_place.append(name)
    return Rollouts(tuple(restart), tuple(in_place), tuple(sorted(set(after) - set(before))),
                    tuple(sorted(set(before) - set(after))))
