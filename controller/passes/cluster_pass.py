"""Cluster mode's pure half: API facts + a checked-out tree -> the generated Change, and per-model targets.

Owns what cluster mode adds around the shared pass (controller.passes.reconcile.run_pass):
- `ClusterFacts`: what the API server said before git is read (GPU slots from node
  labels, profile ConfigMaps, the problems found in them);
- `measured_profiles`: profile ConfigMaps -> profiles filed under `profiles/measured/`
  with the exact text committed there, so a decision can be replayed offline from git;
  only a ConfigMap our profiler Job writes for a model in git is used (`profile_requests`);
- `render_in_cluster`: the pass over a parsed tree (controller.inputs.reader.read_tree)
  with those facts, checked as offline: models, compositions and decision records from git,
  profiles = git ∪ cluster (the cluster's copy of a `profiles/measured/` file replaces git's;
  a measured profile supersedes an estimated one, see controller.inputs.load), slots from the
  nodes (gpus.yaml is ignored); held back when it would prune too much;
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

import yaml

from contract.estimate import profile_relpath
from controller.inputs.layout import CLUSTER_GENERATED, MEASURED_PROFILES_DIR
from controller.inputs.load import TreeInputs, load_documents, parse_model, parse_profile
from controller.observe.facts import ProfileDocument
from controller.passes.reconcile import PassOutput, PruneHold, available_processes, guarded_change, run_pass
from controller.rendering.compose import Rendered, RenderedObject
from controller.rendering.names import profile_configmap_name
from controller.rendering.site import with_install_parameters
from controller.types import Decision, ElasticModel, GpuSlot, InputError, Pending, Profile, Source

MEASURED_DIR = f"{MEASURED_PROFILES_DIR}/"
MEASURED_HEADER = ("# Published by a gpushare profiler Job as a ConfigMap and committed by the controller; "
                   "do not edit by hand.\n")
LIVE_KINDS = ("Deployment", "Job")


@dataclass(frozen=True)
class ClusterFacts:
    """The API server's answers that feed the pass (equal facts and unmoved git: nothing to render)."""

    slots: tuple[GpuSlot, ...]
    profiles: tuple[ProfileDocument, ...]
    errors: tuple[InputError, ...] = ()
    pod_monitors: bool = False  # the API server serves monitoring.coreos.com/v1 PodMonitor (API discovery)


@dataclass(frozen=True)
class ProfileRequest:
    """What the profiler Job the controller renders for a model in git writes into its ConfigMap."""

    model: str
    revision: str
    gpu_product: str


def profile_requests(models: Sequence[ElasticModel], slots: Sequence[GpuSlot]
                     ) -> dict[tuple[str, str], ProfileRequest]:
    """(namespace, ConfigMap name) -> the profile expected there: for each model in git, on its GPU product
    (or each product the nodes offer), in the model's namespace under controller.rendering.names.profile_configmap_name."""
    products = sorted({slot.product for slot in slots})
    requests = {}
    for model in models:
        for product in [model.gpu_product] if model.gpu_product else products:
            name = profile_configmap_name(model.model, model.revision, product)
            requests[(model.namespace, name)] = ProfileRequest(model.model, model.revision, product)
    return requests


@dataclass(frozen=True)
class MeasuredProfiles:
    """Cluster profiles as committed: `files` path -> text, `profiles` parsed with `file` = that path;
    `ignored`: (reason, message) of each ConfigMap or document no profiler Job of ours wrote."""

    files: dict[str, str]
    profiles: tuple[Profile, ...]
    sources: dict[str, str]  # path -> the ConfigMap it came from
    errors: tuple[InputError, ...]
    ignored: tuple[tuple[str, str], ...] = ()


def measured_path(profile: Profile) -> str:
    """profiles/measured/<gpu-product>/<model-slug>.yaml, with `@<revision>` before .yaml unless it is main,
    so two revisions of one model do not overwrite each other."""
    relpath = profile_relpath(profile.model, profile.gpu_product)
    if profile.revision == "main":
        return MEASURED_DIR + relpath
    return f"{MEASURED_DIR}{relpath.removesuffix('.yaml')}@{profile.revision.replace('/', '--')}.yaml"


def measured_profiles(documents: Sequence[ProfileDocument],
                      requests: Mapping[tuple[str, str], ProfileRequest]) -> MeasuredProfiles:
    """Each valid profile of each requested ConfigMap, filed at `measured_path`.

    A ConfigMap is used only at a (namespace, name) in `requests` and only for profiles of the requested
    (model, revision, GPU product); anything else was not written by our profiler Job (anyone may label a
    ConfigMap) and is ignored with a warning. A profile without a revision gets the requested one, which
    its ConfigMap's name carries. Two ConfigMaps with the same (model, revision, GPU product) (two
    namespaces profiled one hub model): the first by namespace/name is committed, so the choice does not
    flip between passes.
    """
    files: dict[str, str] = {}
    profiles: list[Profile] = []
    sources: dict[str, str] = {}
    errors: list[InputError] = []
    ignored: list[tuple[str, str]] = []
    for document in sorted(documents, key=lambda d: (d.namespace, d.name)):
        request = requests.get((document.namespace, document.name))
        if request is None:
            ignored.append(("ProfileNotRequested", f"{document.ref} is labelled as a profile but no ElasticModel "
                            "in git asks for a profile under that namespace and name; ignored (delete it, or "
                            "let the controller's profiler Job write the profile)"))
            continue
        docs, problems = load_documents(document.text, document.ref)
        errors += problems
        for index, doc in docs:
            if isinstance(doc, dict) and "revision" not in doc and request.revision != "main":
                doc = {**doc, "revision": request.revision}
            profile, problems = parse_profile(doc, document.ref, index)
            errors += problems
            if profile is None:
                continue
            found = ProfileRequest(profile.model, profile.revision, profile.gpu_product)
            if found != request:
                ignored.append(("ProfileMismatch", f"{document.ref} document {index} profiles {found.model}@"
                                f"{found.revision} on {found.gpu_product}, but that ConfigMap is where the profile "
                                f"of {request.model}@{request.revision} on {request.gpu_product} belongs; ignored"))
                continue
            path = measured_path(profile)
            if path in files:
                continue
            files[path] = MEASURED_HEADER + yaml.safe_dump(doc, sort_keys=True, allow_unicode=True, width=4096)
            profiles.append(replace(profile, file=path))
            sources[path] = document.ref
    return MeasuredProfiles(files, tuple(profiles), sources, tuple(errors), tuple(ignored))


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
    hold: PruneHold | None = None  # too much would be pruned: the Change keeps upstream's tree


def render_in_cluster(tree: TreeInputs, facts: ClusterFacts, max_prune_share: float = 1.0,
                      install: Mapping[str, object] | None = None) -> ClusterRender:
    """The pass over a parsed tree with the cluster's facts; the files add the measured profiles. A pass that
    would shrink the rendered objects by more than `max_prune_share` keeps upstream's tree (`hold`). `install`:
    the install's composition parameters (controller.rendering.site) over the defaults compositions leave unset."""
    compositions = tree.compositions
    install = {"podMonitor": facts.pod_monitors, **(install or {})}  # a composition that sets podMonitor wins
    if compositions is not None:
        compositions = with_install_parameters(compositions, install)
    measured = measured_profiles(facts.profiles, profile_requests(tree.models, facts.slots))
    replaced = frozenset(measured.files)
    inputs = tree.combined(facts.slots, measured.profiles, replaced, [*facts.errors, *measured.errors])
    output = run_pass(inputs, tree.records, last_plan_md=tree.last_plan_md, compositions=compositions,
                      processes=available_processes(), last_good=tree.last_good_except(replaced), held=tree.held,
                      owners=tree.owners, last_workers=tree.last_workers, rightsizing=tree.rightsizing,
                      prices=tree.prices, last_paths=frozenset(tree.generated))
    new = [path for path, text in measured.files.items() if tree.measured_profiles.get(path) != text]
    files = {**output.files, **{path: text.encode() for path, text in measured.files.items()}}
    before = [path for path in tree.generated if path.startswith(CLUSTER_GENERATED)]
    guarded = guarded_change(before, files, max_prune_share, frozenset(tree.measured_profiles) | output.keep)
    return ClusterRender(output, dict(guarded.files), _message(output, new, measured.sources), guarded.keep,
                         measured.ignored, guarded.hold)


def _message(output: PassOutput, new_profiles: list[str], sources: Mapping[str, str]) -> str:
    """The pass's message; profiles committed are named in the body (and the subject when no decision moved)."""
    if not new_profiles:
        return output.message
    lines = [f"profile committed: {path} (from {sources[path]})" for path in new_profiles]
    subject, _, body = output.message.partition("\n")
    if not output.rendered.changes:
        what = new_profiles[0] if len(new_profiles) == 1 else f"{len(new_profiles)} profiles"
        subject = f"gpushare: commit measured {what}"
    rest = [line for line in body.strip().splitlines() if line]
    return subject + "\n\n" + "\n".join(lines + rest) + "\n"


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
    for error in output.inputs.errors:
        if error.object and "/" in error.object and not error.object.startswith(("Node/", "ConfigMap/")):
            namespace, name = error.object.split("/", 1)
            found.setdefault((namespace, name), error)
        elif not error.object:
            for key in by_file.get(error.file, ()):
                found.setdefault(key, error)
    for problem in output.rendered.errors:
        namespace, _, name = problem.ref.partition("/")
        model = models.get((namespace, name))
        where = model.source.file if model is not None and model.source is not None else "models/"
        found.setdefault((namespace, name), InputError(
            file=where, document=model.source.document if model and model.source else None, path="spec",
            message=f"its objects could not be rendered: {problem.message}", fix=problem.fix,
            reason=problem.reason, object=problem.ref))
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


def not_in_git(namespace: str, name: str, branch: str) -> InputError:
    return InputError(
        file=f"models/ on branch {branch}", document=None, path="metadata.name", reason="NotInGit",
        message=f"ElasticModel {namespace}/{name} is in the cluster but not in git, the source of truth; "
                "the controller plans only what models/ holds",
        fix="commit it under models/ (Argo CD syncs it from there), or delete it from the cluster",
        object=f"{namespace}/{name}")
