"""Which workers a commit restarts and which reconfigure in place (terraform-style "1 restart · 2 in place").

A worker's Deployment rolls only when its pod template changes (image, resources, GPU
share, volumes); a changed worker.yaml alone reaches the running worker through its
mounted ConfigMap and is applied in place. Pure: compares the previous rendered tree's
worker Deployments and ConfigMaps with the new ones. Called by controller.rendering.compose
for PLAN.md (its summary and its workers line) and by controller.passes.reconcile for the commit message.

The new tree's Deployments come as the objects compose rendered, so what a pass wrote is never
parsed back; a previous Deployment whose text is the one the pass wrote is that same object, and
any other text is parsed once, with libyaml (parsing both trees with PyYAML's pure-Python loader
took seconds at a few hundred workers).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import yaml

from contract.wire import WORKER_POD_LABEL as WORKER_LABEL

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


_Worker = tuple[str, dict, list[str]]  # a worker Deployment's name, pod template, mounted ConfigMap names


def _worker(doc: object) -> _Worker | None:
    """The worker a Deployment defines; None when it is not a worker (no worker label)."""
    labels = ((doc or {}).get("metadata") or {}).get("labels") or {}
    if labels.get(WORKER_LABEL[0]) != WORKER_LABEL[1]:
        return None
    template = doc["spec"]["template"]
    mounted = [v["configMap"]["name"] for v in template["spec"].get("volumes", []) if "configMap" in v]
    return doc["metadata"]["name"], template, mounted


def _parse(text: str) -> object:
    """The object a Deployment file of the previous tree writes (libyaml's safe loader)."""
    return yaml.load(text, Loader=yaml.CSafeLoader)


def _workers(files: Mapping[str, str], parsed: dict[str, _Worker | None]) -> dict[str, tuple[dict, str | None]]:
    """worker name -> (pod template, the text of the ConfigMap it mounts). `parsed`: Deployment text -> its
    worker, filled here and shared between the two trees of one comparison."""
    by_path = {p: t for p, t in files.items() if "/deployment-" in p or "/configmap-" in p}
    out = {}
    for path, text in by_path.items():
        if "/deployment-" not in path:
            continue
        if text not in parsed:
            parsed[text] = _worker(_parse(text))
        worker = parsed[text]
        if worker is None:
            continue
        name, template, mounted = worker
        folder = path.rsplit("/", 1)[0]
        config = next((by_path.get(f"{folder}/configmap-{cm}.yaml") for cm in mounted), None)
        out[name] = (template, config)
    return out


def worker_rollouts(previous: Mapping[str, str], current: Mapping[str, str],
                    rendered: Mapping[str, dict] | None = None) -> Rollouts:
    """`previous`, `current`: path -> text of the two trees' files (their Deployments and ConfigMaps at least);
    `rendered`: path -> the object of each Deployment in `current` whose object is at hand (the others are
    parsed)."""
    parsed = {current[path]: _worker(doc) for path, doc in (rendered or {}).items() if path in current}
    before, after = _workers(previous, parsed), _workers(current, parsed)
    restart, in_place = [], []
    for name in sorted(set(before) & set(after)):
        (old_template, old_config), (new_template, new_config) = before[name], after[name]
        if old_template != new_template:
            restart.append(name)
        elif old_config != new_config:
            in_place.append(name)
    return Rollouts(tuple(restart), tuple(in_place), tuple(sorted(set(after) - set(before))),
                    tuple(sorted(set(before) - set(after))))
