"""Cluster mode's pure half: API facts + a checked-out tree -> the generated Change, and per-model targets.

Owns what cluster mode adds around the shared pass (controller.passes.reconcile.run_pass):
- `render_in_cluster`: the pass over a tree as read (controller.inputs.reader.read_repo)
  with the cluster's facts (controller.passes.measured.ClusterFacts), called as offline
  calls it: models, compositions and decision records from git, profiles = git ∪ cluster
  (the cluster's copy of a `profiles/measured/` file replaces git's; a measured profile
  supersedes an estimated one, see controller.inputs.load), slots from the nodes
  (gpus.yaml is ignored); held back when it would prune too much;
- `ModelView`: for one planned model, its decision or pending entry, its input error,
  the paths rendered for it and the live objects (Deployments, Jobs) it owns;
- `verdict_sources`: the verdict ConfigMaps of the workers the pass rendered (the only ones read);
- `application_for`: which Argo CD Application syncs a model's rendered files;
- `status_model`: the model an ElasticModel object's status is written for (None while the
  object differs from git), and `not_in_git`, the error of an object git does not hold.
No I/O. Called by controller.cli.cluster_loop.
"""
from __future__ import annotations

import posixpath
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from controller.inputs.layout import SINGLE, Layout
from controller.inputs.load import parse_model
from controller.inputs.tree import Tree
from controller.passes.measured import ClusterFacts
from controller.passes.reconcile import PassOutput, PruneHold, available_processes, guarded_change, run_pass
from controller.rendering.compose import Rendered, RenderedObject
from controller.types import Decision, ElasticModel, InputError, Pending, Source

LIVE_KINDS = ("Deployment", "Job")


@dataclass(frozen=True)
class ClusterRender:
    """One render of a checked-out tree: the pass's output and the generated files, message and the
    committed measured profiles that stay (the shell hands them to gitops as a Change)."""

    output: PassOutput
    files: dict[str, bytes]
    message: str
    keep: frozenset[str]
    ignored: tuple[tuple[str, str], ...] = ()  # (reason, message) of profile ConfigMaps not used
    hold: PruneHold | None = None  # too much would be pruned: no files, everything upstream kept


def render_in_cluster(tree: Tree, facts: ClusterFacts, max_prune_share: float = 1.0,
                      install: Mapping[str, object] | None = None) -> ClusterRender:
    """The pass over a parsed tree with the cluster's facts (controller.passes.reconcile.run_pass); the files
    add the measured profiles. A pass that would shrink the rendered objects by more than `max_prune_share`
    keeps upstream's tree (`hold`)."""
    output = run_pass(tree, facts, install=install, processes=available_processes())
    before = [path for path in tree.last.paths or () if path.startswith(tree.layout.cluster_generated)]
    guarded = guarded_change(before, output.files, max_prune_share, frozenset(tree.measured_profiles) | output.keep,
                             tree.layout)
    return ClusterRender(output, dict(guarded.files), output.message, guarded.keep, output.ignored, guarded.hold)


# ---------------------------------------------------------------- per model


LiveObject = RenderedObject  # a rendered Deployment or Job whose live state status reads


@dataclass(frozen=True)
class ModelView:
    """What the pass says about one ElasticModel, as status needs it."""

    model: ElasticModel | None  # as planned (its last good spec when its document is broken)
    decision: Decision | None = None
    pending: Pending | None = None
    error: InputError | None = None
    paths: tuple[str, ...] = ()  # generated files that hold its objects or decision
    live: tuple[LiveObject, ...] = ()
    url: str | None = None  # its endpoint: the gpushare.dev/url of its Service in its own namespace

    def objects(self, kind: str) -> tuple[LiveObject, ...]:
        return tuple(o for o in self.live if o.kind == kind)

    @property
    def rendered_paths(self) -> tuple[str, ...]:
        return tuple(p for p in self.paths if p.startswith("rendered/"))


def model_views(output: PassOutput) -> dict[tuple[str, str], ModelView]:
    """Every model the pass planned or failed to read, by (namespace, name)."""
    models = {m.key: m for m in output.inputs.models}
    decisions = {d.key: d for d in output.plan.decisions}
    pending = {p.key: p for p in output.plan.pending}
    errors = _errors_by_key(output, models)
    paths: dict[str, list[str]] = defaultdict(list)
    for path, refs in output.rendered.owners.items():
        for ref in refs:
            paths[ref].append(path)
    live = _live_objects(output.rendered)
    views = {}
    for key in sorted({*models, *errors}):
        ref = f"{key[0]}/{key[1]}"
        owned = tuple(sorted(paths.get(ref, ())))
        views[key] = ModelView(model=models.get(key), decision=decisions.get(key), pending=pending.get(key),
                               error=errors.get(key), paths=owned,
                               live=tuple(o for p in owned for o in live.get(p, ())),
                               url=output.rendered.urls.get(ref))
    return views


def _errors_by_key(output: PassOutput, models: Mapping[tuple[str, str], ElasticModel]
                   ) -> dict[tuple[str, str], InputError]:
    """The first problem of each model: its own input error, a whole-file error of the file its last
    good spec came from, or what kept its objects from being rendered."""
    found: dict[tuple[str, str], InputError] = {}
    by_file = defaultdict(list)
    for model in models.values():
        if model.source is not None:
            by_file[model.source.file].append(model.key)
    for error in output.errors:  # the inputs' errors, then what kept a model's objects from being rendered
        if error.object and "/" in error.object and not error.object.startswith(("Node/", "ConfigMap/")):
            namespace, name = error.object.split("/", 1)
            found.setdefault((namespace, name), error)
        elif not error.object:
            for key in by_file.get(error.file, ()):
                found.setdefault(key, error)
    return found


def _live_objects(rendered: Rendered) -> dict[str, tuple[LiveObject, ...]]:
    """path -> the Deployment or Job that rendered file holds (one object per file, as compose writes)."""
    return {path: (o,) for path, o in rendered.objects.items()
            if o.kind in LIVE_KINDS}


def verdict_sources(rendered: Rendered) -> frozenset[tuple[str, str]]:
    """(namespace, name) of the verdict ConfigMap of each worker the pass rendered: the only verdicts the
    controller reads."""
    return rendered.verdict_sources


# ---------------------------------------------------------------- Argo CD


def source_paths(application: dict) -> tuple[str, ...]:
    """The repository directories an Application syncs ('' for the whole repository or when unknown)."""
    spec = application.get("spec") or {}
    sources = spec.get("sources") or ([spec["source"]] if spec.get("source") else [])
    paths = tuple(_directory(s.get("path")) for s in sources if isinstance(s, dict))
    return paths or ("",)


def _directory(path: str | None) -> str:
    clean = posixpath.normpath(path or ".").strip("/")
    return "" if clean == "." else clean


def application_for(rendered: Sequence[str], applications: Sequence[dict]) -> dict | None:
    """The Application whose source directory holds every rendered file of the model (the deepest such
    directory wins); with nothing rendered (a refused model), the first Application, which syncs the removal."""
    if not rendered:
        return applications[0] if applications else None
    best, depth = None, -1
    for application in applications:
        for directory in source_paths(application):
            holds = all(directory == "" or p.startswith(directory + "/") for p in rendered)
            if holds and len(directory) > depth:
                best, depth = application, len(directory)
    return best


# ---------------------------------------------------------------- the objects in the cluster


def cluster_model(obj: dict) -> ElasticModel:
    """The cluster object as a model, for its key, generation and SLO flag (its spec may be unusable)."""
    meta, spec = obj["metadata"], obj.get("spec") or {}
    doc = {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"), "spec": spec,
           "metadata": {"name": meta["name"], "namespace": meta.get("namespace", "")}}
    parsed, _ = parse_model(doc, Source(f"ElasticModel/{meta.get('namespace', '')}/{meta['name']}"))
    generation = meta.get("generation") or 1
    if parsed is not None:
        return replace(parsed, generation=generation)
    return ElasticModel(name=meta["name"], namespace=meta.get("namespace", ""), model=str(spec.get("model", "")),
                        budget_bytes=0, generation=generation, has_slo="slo" in spec)


def status_model(obj: dict, view: ModelView | None) -> ElasticModel | None:
    """The model status is written for, with the cluster object's generation; None while the cluster's spec
    differs from git's valid one (Argo CD has not synced models/ yet), so the status never claims a
    generation the pass did not plan."""
    in_cluster = cluster_model(obj)
    if view is None or view.model is None:
        return in_cluster
    if view.error is None and replace(in_cluster, generation=view.model.generation) != view.model:
        return None
    return replace(view.model, generation=in_cluster.generation)


def not_in_git(namespace: str, name: str, branch: str, layout: Layout = SINGLE) -> InputError:
    if layout.cluster is not None:
        return InputError(
            file=f"models/ on branch {branch}", document=None, path="spec.placement", reason="NotInGit",
            message=f"ElasticModel {namespace}/{name} is in cluster {layout.cluster}, but git places no model of "
                    f"that name on {layout.cluster}, so the controller plans none",
            fix=f"place it on {layout.cluster} (spec.placement, or {layout.own_models}/), or delete it from the "
                "cluster", object=f"{namespace}/{name}")
    return InputError(
        file=f"models/ on branch {branch}", document=None, path="metadata.name", reason="NotInGit",
        message=f"ElasticModel {namespace}/{name} is in the cluster but not in git, the source of truth; "
                "the controller plans only what models/ holds",
        fix="commit it under models/ (Argo CD syncs it from there), or delete it from the cluster",
        object=f"{namespace}/{name}")
