"""Which workers a commit restarts and which reconfigure in place (terraform-style "1 restart · 2 in place"),
and which models go down while a worker restarts, for about how long.

A worker's Deployment rolls only when its pod template changes (image, a composition parameter of the
pod's shape, the slot); a changed worker.yaml alone reaches the running worker through its mounted
ConfigMap and is applied in place. A model that served on a restarting worker and stays on it is down
until the new pod loads it: the worker loads its models one after another, smallest first, so a model
waits for the weights of those before it and its own, read at LOAD_BYTES_PER_S (the weights come from
each entry's footprint terms, i.e. its profile). Pure: compares the previous rendered tree's worker
Deployments and ConfigMaps with the new ones. Called by controller.rendering.compose
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

from contract.footprint import terms_from_document
from contract.wire import WORKER_CONFIG_DATA_KEY
from contract.wire import WORKER_POD_LABEL as WORKER_LABEL

LINE_PREFIX = "Workers: "
LOAD_BYTES_PER_S = 200 * 10**6  # weights read from a slow network volume; local NVMe reads several times faster


@dataclass(frozen=True)
class Down:
    """A model that serves before a worker restarts and after it: down until the new pod has loaded it."""

    model: str  # namespace/name
    seconds: float | None  # about how long, from the pod's start; None: a model before it has no footprint terms

    @property
    def words(self) -> str:
        if self.seconds is None:
            return f"{self.model} (load time unknown: no profile)"
        return f"{self.model} ~{_duration(self.seconds)}"


def _duration(seconds: float) -> str:
    whole = max(1, round(seconds))
    return f"{whole} s" if whole < 120 else f"{whole // 60} min {whole % 60:02d} s"


@dataclass(frozen=True)
class Rollouts:
    restart: tuple[str, ...] = ()
    in_place: tuple[str, ...] = ()
    new: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    down: tuple[tuple[str, tuple[Down, ...]], ...] = ()  # per restarting worker, the models it takes down

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
        down = [f" Down while {worker} restarts (from the new pod's start, loading smallest first at "
                f"{LOAD_BYTES_PER_S // 10**6} MB/s): {', '.join(d.words for d in models)}."
                for worker, models in self.down if models]
        return f"{LINE_PREFIX}{self.summary} ({'; '.join(named)}).{''.join(down)}"


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
    restart, in_place, down = [], [], []
    for name in sorted(set(before) & set(after)):
        (old_template, old_config), (new_template, new_config) = before[name], after[name]
        if old_template != new_template:
            restart.append(name)
            down.append((name, models_down(old_config, new_config)))
        elif old_config != new_config:
            in_place.append(name)
    return Rollouts(tuple(restart), tuple(in_place), tuple(sorted(set(after) - set(before))),
                    tuple(sorted(set(before) - set(after))), tuple(down))


def models_down(old_config: str | None, new_config: str | None) -> tuple[Down, ...]:
    """The models of a restarting worker that serve before and after (texts of its old and new ConfigMap), each
    with about how long it is down: the new pod loads every model smallest first, each after the ones before."""
    serving = {_ref(m) for m in _entries(old_config)}
    elapsed: float | None = 0.0
    out = []
    for entry in sorted(_entries(new_config), key=lambda m: (_weight_bytes(m) or 0, _ref(m))):
        weight = _weight_bytes(entry)
        elapsed = None if elapsed is None or weight is None else elapsed + weight / LOAD_BYTES_PER_S
        if _ref(entry) in serving:
            out.append(Down(_ref(entry), elapsed))
    return tuple(out)


def _entries(configmap: str | None) -> list[dict]:
    """The model entries of a worker ConfigMap's worker.yaml ([] when it is missing or unreadable)."""
    if not configmap:
        return []
    try:
        document = yaml.load(_parse(configmap)["data"][WORKER_CONFIG_DATA_KEY], Loader=yaml.CSafeLoader)
        return [m for m in document["models"] if isinstance(m, dict)]
    except (TypeError, KeyError, yaml.YAMLError):
        return []


def _ref(entry: dict) -> str:
    return f"{entry.get('namespace')}/{entry.get('name')}"


def _weight_bytes(entry: dict) -> int | None:
    try:
        return terms_from_document(entry["footprint"]).weight_bytes
    except (KeyError, TypeError, ValueError):
        return None
