"""compose: decisions → the generated tree (rendered manifests, decisions, PLAN.md).

Owns turning one pass's plan into files: per model awaiting a profile its
composition's profiling objects; per (GPU slot, composition) a worker (ConfigMap
with worker.yaml, Deployment, its RBAC); per placed ElasticModel a Service; per
decision `decisions/<namespace>/<name>.yaml`; and rendered/PLAN.md. With clusters/, one
cluster's tree: the same under rendered/<cluster>/ and decisions/<cluster>/, plus each ElasticModel the
cluster plans, as its user wrote it (rendered/<cluster>/<namespace>/elasticmodel-<name>.yaml: how
the objects reach only the clusters that select them). Every object
is rendered in the sandbox (controller.rendering.render), validated against Kubernetes'
schemas (controller.rendering.kube_validate) and the API server's rules beyond them
(controller.inputs.kube_rules) and written with sorted keys to a path built
only from DNS-1123 names. One bad model is reported in `errors` and never blocks
the others. Pure: no I/O besides reading the template files when no compositions
are passed in. Called by the reconcile pass; gitops writes `files`.
"""
from __future__ import annotations

import hashlib
import math
import posixpath
import re
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

import jsonschema

from contract.wire import SOURCE_ANNOTATION

from controller.cpu import forked_map
from controller.inputs.cache_policy import host_path_problem, host_path_root
from controller.inputs.compositions import Composition, shipped_compositions
from controller.inputs.tree import LastPass
from controller.rendering.compose_errors import (RULE_ERRORS, ComposeError, HostPathOutsideRoot, InvalidName,
                                                 ManifestInvalid, MixedCompositions, NameCollision, OutputConflict,
                                                 PoolWorkerWithoutGpu, RenderFailed, ServedNameTaken,
                                                 UnknownComposition, UnknownSlot)
from controller.rendering.kube_validate import KUBERNETES_VERSION, NoSchema, validate_object
from controller.rendering.kube_validate import warm as warm_validators
from controller.inputs.kube_rules import (Problem, custom_resource_problems, is_dns_label, is_label_value,
                                          object_problems)
from controller.inputs.layout import SINGLE, Layout
from controller.rendering.names import (dns_label, profile_configmap_name, profiler_job_name, service_name,
                                        worker_name)
from controller.rendering.profiling_place import Beside, profiling_place
from controller.planning.bill import Bill
from controller.rendering.planmd import Change, created_jobs, decision_changes, last_change_lines, plan_markdown
from controller.rendering.rollouts import Rollouts, worker_rollouts
from controller.rendering.render import RenderError, compiled, render_documents
from controller.serialize import decision_to_dict, model_to_doc
from controller.types import Decision, ElasticModel, GpuSlot, Pending, Plan
from controller.rendering.yamlout import dump
from controller.rendering.workerconfig import entry_problem, model_entry, worker_config

RENDERED = SINGLE.rendered  # the paths compose builds; a cluster's tree is moved under its own (`_moved`)
DECISIONS = SINGLE.decisions
PLAN_FILE = SINGLE.plan_md
MIB = 1 << 20
STARTUP_BASE_S = 120  # python and torch start until /healthz answers (models are fetched and load after)
STARTUP_PROBE_PERIOD_S = 10  # templates/worker-deployment.yaml.j2 startupProbe.periodSeconds
STARTUP_FAILURE_THRESHOLD = math.ceil(STARTUP_BASE_S / STARTUP_PROBE_PERIOD_S)
# a pool node's worker may wait for the autoscaler to add its node (a GPU node, its driver, the worker image):
# its Deployment reports ProgressDeadlineExceeded (Argo CD: Degraded) only after this long, not the default 10 min
POOL_PROGRESS_DEADLINE_S = 1800
GPU_RESOURCE = "nvidia.com/gpu"
_PATH_PART = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


@dataclass(frozen=True)
class RenderedObject:
    """The Kubernetes object one rendered file holds."""

    kind: str
    namespace: str
    name: str


@dataclass(frozen=True)
class Rendered:
    """The generated tree of one pass: repo-relative path → text, what could not be rendered, and a typed
    index of what was rendered (so later stages never parse the YAML this pass wrote)."""

    files: dict[str, str]
    errors: tuple[ComposeError, ...]
    owners: dict[str, tuple[str, ...]]  # path → the ElasticModels (namespace/name) whose objects it holds
    changes: tuple[Change, ...]
    objects: dict[str, RenderedObject] = field(default_factory=dict)  # rendered/ path → its object
    verdict_sources: frozenset[tuple[str, str]] = frozenset()  # each rendered worker's verdicts ConfigMap
    urls: dict[str, str] = field(default_factory=dict)  # namespace/name -> its endpoint (status.url)
    rollouts: Rollouts = Rollouts()  # the workers this tree restarts or reconfigures in place (none when unknown)
    models: frozenset[str] = frozenset()  # with clusters/: the rendered ElasticModel files (rendered for any model)


@dataclass(frozen=True)
class _File:
    path: str
    text: str
    object: RenderedObject | None = None  # None for decision files
    document: dict | None = None  # the object `text` writes (None for decision files)


@dataclass
class _Tree:
    files: dict[str, str] = field(default_factory=dict)
    owners: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    objects: dict[str, RenderedObject] = field(default_factory=dict)
    verdict_sources: set[tuple[str, str]] = field(default_factory=set)
    urls: dict[str, str] = field(default_factory=dict)
    deployments: dict[str, dict] = field(default_factory=dict)  # rendered/ path → its Deployment

    def add(self, unit: list[_File], owners: Sequence[str]) -> None:
        """Write every file of one unit, or none of them when one would overwrite a different object."""
        for f in unit:
            if self.files.get(f.path, f.text) != f.text:
                raise OutputConflict(owners[0], f"{f.path} is already rendered with different content by "
                                     f"{', '.join(sorted(self.owners[f.path]))}",
                                     "give the objects distinct names in the composition's templates")
        for f in unit:
            self.files[f.path] = f.text
            self.owners[f.path].update(owners)
            if f.object is not None:
                self.objects[f.path] = f.object
                if f.object.kind == "Deployment":  # the worker rollouts compare these, never parsed back
                    self.deployments[f.path] = f.document

    def merge(self, other: _Tree) -> None:
        """Add a disjoint part rendered in another process."""
        self.files.update(other.files)
        for path, refs in other.owners.items():
            self.owners[path].update(refs)
        self.objects.update(other.objects)
        self.verdict_sources.update(other.verdict_sources)
        self.urls.update(other.urls)
        self.deployments.update(other.deployments)


@dataclass(frozen=True)
class _Served:
    model: ElasticModel
    decision: Decision
    entry: dict


PARALLEL_MIN_DECISIONS = 2000  # below this, one process renders faster than several start
# What the shipped templates render: their validators are compiled once, before forking.
SHIPPED_KINDS = (("v1", "ConfigMap"), ("v1", "Service"), ("v1", "ServiceAccount"), ("apps/v1", "Deployment"),
                 ("batch/v1", "Job"), ("rbac.authorization.k8s.io/v1", "Role"),
                 ("rbac.authorization.k8s.io/v1", "RoleBinding"), ("networking.k8s.io/v1", "NetworkPolicy"))


def warm_up() -> None:
    """Compile now what compose compiles at its first use: the Kubernetes validators of the shipped kinds and the
    shipped compositions' templates (a shell runs it while git fetches)."""
    warm_validators(SHIPPED_KINDS)
    for composition in shipped_compositions().values():
        environment = compiled(composition.templates)
        for name in composition.templates.sources:
            environment.get_template(name)


def compose(models: Sequence[ElasticModel], plan: Plan, slots: Sequence[GpuSlot], last: LastPass = LastPass(), *,
            compositions: Mapping[str, Composition] | None = None, processes: int = 1,
            profile_sources: Mapping[tuple[str, str, str], str] | None = None, sections: Sequence[str] = (),
            bills: tuple[Bill, Bill] | None = None, layout: Layout = SINGLE) -> Rendered:
    """The generated tree. With `processes` > 1 and a large plan, the objects of disjoint sets of GPU
    slots render in that many forked processes; the result is byte-identical to one process. `last`: the last
    pass's result (controller.inputs.tree.LastPass): its decisions, which the changes are counted from; its
    PLAN.md, whose summary a quiet pass keeps; its paths, which tell the profiler Jobs this tree creates; its
    worker Deployments and ConfigMaps, which tell the workers this tree restarts from those it reconfigures in
    place. `sections`: further PLAN.md lines (the open right-sizing recommendations), placed before the changes;
    `bills`: the last decisions' and this plan's GPUs and cost (controller.planning.bill), for PLAN.md. `layout`:
    whose paths (one cluster's, with clusters/): that cluster's tree, its ElasticModels in it."""
    compositions = shipped_compositions() if compositions is None else compositions
    if processes > 1 and len(plan.decisions) >= PARALLEL_MIN_DECISIONS:
        tree, errors = _objects_in_parallel(models, plan, slots, compositions, processes)
    else:
        tree, errors = _objects(models, plan, slots, compositions)
    propagated = _elastic_models(models, tree, errors) if layout.cluster is not None else set()
    _namespaces(tree, {str(c.parameters["workerNamespace"]) for c in compositions.values()})
    if layout.cluster is not None:
        move = _mover(layout)
        tree, propagated = _moved(tree, move), set(map(move, propagated))
    failed = {error.ref for error in errors}  # never reported as new or placed: their objects are not rendered
    changes = tuple(c for c in decision_changes(last.previous, plan) if c.ref not in failed)
    rollouts = worker_rollouts(last.workers, tree.files, tree.deployments) if last.workers is not None else None
    tree.files[layout.plan_md] = plan_markdown(models, plan, slots, changes, errors, last_change_lines(last.plan_md),
                                               profile_sources, jobs_created=None if last.paths is None
                                               else len(created_jobs(last.paths, tree.files, layout.rendered)),
                                               rollouts=rollouts, sections=sections, bills=bills,
                                               cluster=layout.cluster)
    return Rendered(
        files=dict(sorted(tree.files.items())),
        errors=tuple(errors),
        owners={path: tuple(sorted(refs)) for path, refs in sorted(tree.owners.items())},
        changes=changes,
        objects=dict(sorted(tree.objects.items())),
        verdict_sources=frozenset(tree.verdict_sources),
        urls=dict(sorted(tree.urls.items())),
        rollouts=rollouts or Rollouts(),
        models=frozenset(propagated),
    )


def _elastic_models(models: Sequence[ElasticModel], tree: _Tree, errors: list[ComposeError]) -> set[str]:
    """Each model's ElasticModel object as its user wrote it (its namespace and source file set; its status and its
    spec.placement left out: which clusters run it is the repository's business, and a model moved between two
    clusters leaves a third one's tree as it was), so the cluster's Argo CD Application syncs it with the objects
    that serve it; the paths written. A model without its document (served from its last good spec: its document
    is broken now) keeps the object the last pass rendered (controller.passes.reconcile.run_pass)."""
    written = set()
    for model in sorted(models, key=lambda m: m.key):
        if model.document is None:
            continue
        doc = {k: v for k, v in model.document.items() if k != "status"}
        if isinstance(doc.get("spec"), dict):
            doc["spec"] = {k: v for k, v in doc["spec"].items() if k != "placement"}
        metadata = dict(doc.get("metadata") or {})
        source = model.source.file if model.source else ""
        doc["metadata"] = {**metadata, "namespace": model.namespace,
                           "annotations": {**(metadata.get("annotations") or {}), SOURCE_ANNOTATION: source}}

        def add(model: ElasticModel = model, doc: dict = doc) -> None:
            problems = custom_resource_problems(doc)  # metadata the API server refuses would fail the sync
            if problems:
                shown = "; ".join(f"{p.where} {_shown(p.value)}: {p.message}" for p in problems[:3])
                raise RULE_ERRORS[problems[0].reason](
                    model.ref, f"its ElasticModel object: the Kubernetes API server would refuse it: {shown}",
                    "fix the field named there in the model's file (docs/limits.md, \"Rendered objects\")")
            path = _elastic_model_file(model)
            tree.add([_File(path, dump(doc), RenderedObject("ElasticModel", model.namespace, model.name))],
                     [model.ref])
            written.add(path)

        _guarded(errors, add)
    return written


def elastic_model_path(model: ElasticModel, layout: Layout = SINGLE) -> str:
    """Where a cluster's tree holds one of its ElasticModels (under `layout`'s rendered tree)."""
    return _mover(layout)(_elastic_model_file(model))


def _elastic_model_file(model: ElasticModel) -> str:
    return _safe_path(model.ref, RENDERED, model.namespace, f"elasticmodel-{model.name}.yaml")


def _mover(layout: Layout) -> Callable[[str], str]:
    """A path compose built, under `layout`'s own rendered and decisions folders: the function that moves it, its
    folders looked up once (a cluster's tree moves thousands of paths)."""
    tops = tuple((top + "/", own + "/") for top, own in ((RENDERED, layout.rendered), (DECISIONS, layout.decisions)))

    def move(path: str) -> str:
        for top, own in tops:
            if path.startswith(top):
                return own + path[len(top):]
        return path

    return move


def _moved(tree: _Tree, move: Callable[[str], str]) -> _Tree:
    """The tree with every path moved by `move` (a layout's _mover: under rendered/<cluster>/, decisions/<cluster>/)."""
    to = {path: move(path) for path in tree.files}  # each path moved once: the other maps hold files' paths only
    moved = _Tree(verdict_sources=tree.verdict_sources, urls=tree.urls)
    moved.files = {to[path]: text for path, text in tree.files.items()}
    moved.owners.update({to[path]: refs for path, refs in tree.owners.items()})
    moved.objects = {to[path]: obj for path, obj in tree.objects.items()}
    moved.deployments = {to[path]: doc for path, doc in tree.deployments.items()}
    return moved


def _objects(models: Sequence[ElasticModel], plan: Plan, slots: Sequence[GpuSlot],
             compositions: Mapping[str, Composition]) -> tuple[_Tree, list[ComposeError]]:
    """Every generated file but PLAN.md: profiler Jobs, worker objects, Services, decision files."""
    by_key = {m.key: m for m in models}
    tree, errors = _Tree(), []
    _profiling_step(plan.pending, by_key, compositions, tree, errors, slots, plan.decisions)
    workers, refused = _group(plan.decisions, by_key, {s.id: s for s in slots}, compositions, errors)
    served = _serving_step(workers, compositions, tree, errors)
    for decision in sorted(refused + served, key=lambda d: d.key):
        _guarded(errors, lambda d: tree.add([_decision_file(d, by_key[d.key])], [f"{d.namespace}/{d.name}"]),
                 decision)
    return tree, errors


def _objects_in_parallel(models, plan: Plan, slots: Sequence[GpuSlot], compositions, processes: int):
    """Split the slots into `processes` groups of about equal decision counts (the pending and slot-less
    decisions go with the first), render the first group here and each other one in a forked process, merge."""
    on_slot: dict[str | None, list[Decision]] = defaultdict(list)
    for decision in plan.decisions:
        on_slot[decision.slot].append(decision)
    share = math.ceil(len(plan.decisions) / processes)
    parts: list[tuple[list[GpuSlot], list[Decision]]] = [([], list(on_slot.get(None, [])))]
    for group in _name_sharing_groups(models, slots, on_slot):
        if len(parts[-1][1]) >= share and len(parts) < processes:
            parts.append(([], []))
        for slot in group:
            parts[-1][0].append(slot)
            parts[-1][1].extend(on_slot.get(slot.id, []))
    warm_validators(SHIPPED_KINDS)  # once, before the children that would each compile them are forked
    results = forked_map(_objects, [(models, Plan(decisions=tuple(decisions), pending=plan.pending if i == 0 else ()),
                                     part_slots, compositions) for i, (part_slots, decisions) in enumerate(parts)])
    tree, errors = _Tree(), []
    for part, part_errors in results:
        for path in tree.files.keys() & part.files.keys():  # the groups are disjoint: a clash is a template bug
            if tree.files[path] != part.files[path]:
                errors.append(OutputConflict(sorted(part.owners[path])[0], f"{path} is rendered with different "
                                             f"content by {', '.join(sorted(tree.owners[path] | part.owners[path]))}",
                                             "give the objects distinct names in the composition's templates"))
        tree.merge(part)
        errors.extend(part_errors)
    return tree, errors


def _name_sharing_groups(models: Sequence[ElasticModel], slots: Sequence[GpuSlot],
                         on_slot: Mapping[str | None, list[Decision]]) -> list[list[GpuSlot]]:
    """The slots in id order, those whose workers would take one name (a NameCollision, found only where both
    render in one process) joined into one group, placed at its first slot."""
    composition_of = {m.key: m.composition for m in models}
    first: dict[str, str] = {}  # slot id -> the first slot id of its group (union-find, roots by smallest id)

    def root(slot_id: str) -> str:
        while first.get(slot_id, slot_id) != slot_id:
            slot_id = first[slot_id]
        return slot_id

    claimed: dict[str, str] = {}  # worker name -> a slot id that takes it
    for slot in sorted(slots, key=lambda s: s.id):
        for decision in on_slot.get(slot.id, []):
            other = claimed.setdefault(worker_name(slot, composition_of.get(decision.key, "")), slot.id)
            a, b = sorted((root(other), root(slot.id)))
            first[b] = a
    groups: dict[str, list[GpuSlot]] = {}
    for slot in sorted(slots, key=lambda s: s.id):
        groups.setdefault(root(slot.id), []).append(slot)
    return list(groups.values())


def _guarded(errors: list[ComposeError], step: Callable[..., object], *args: object) -> bool:
    """Run one model's step; its ComposeError is recorded instead of stopping the pass."""
    try:
        step(*args)
    except ComposeError as exc:
        errors.append(exc)
        return False
    return True


def _profiling_step(pending: Sequence[Pending], by_key: Mapping, compositions: Mapping[str, Composition],
                    tree: _Tree, errors: list[ComposeError], slots: Sequence[GpuSlot],
                    decisions: Sequence[Decision]) -> None:
    """Each model awaiting a profile: its composition's profiling objects, on a free GPU or beside the workers.
    The models of one namespace that await the same profile share one Job, measured at the largest
    concurrency and context among them (decode time grows with both)."""
    runs: dict[tuple[str, str, str, str, str], _ProfileRun] = {}
    for item in pending:
        model = by_key.get(item.key)
        if model is not None:
            key = _profile_key(item)
            runs[key] = runs.get(key, _ProfileRun()).widened(model.slo.concurrency, model.slo.context_tokens)

    def render(item: Pending) -> None:
        model, composition = _admit(item, by_key, compositions)
        beside = profiling_place(item.gpu_product, slots, decisions)
        tree.add(_profiling(model, item, composition, beside, runs[_profile_key(item)]), [model.ref])

    for item in sorted(pending, key=lambda p: p.key):
        _guarded(errors, render, item)


def _group(decisions: Sequence[Decision], by_key: Mapping, slot_by_id: Mapping[str, GpuSlot],
           compositions: Mapping[str, Composition], errors: list[ComposeError]):
    """Placed models grouped by (slot, composition), the valid refused decisions apart."""
    workers: dict[tuple[GpuSlot, str], list[_Served]] = defaultdict(list)
    refused: list[Decision] = []
    composition_on: dict[str, str] = {}  # slot id -> the composition whose worker runs there
    served_by: dict[tuple[str, str], str] = {}  # (slot id, model name) -> the ElasticModel served under it

    def place(decision: Decision) -> None:
        model, composition = _admit(decision, by_key, compositions)
        if decision.mode == "refused":
            refused.append(decision)
            return
        slot = _slot(decision, slot_by_id)
        other = composition_on.get(slot.id, composition.name)
        if other != composition.name:
            raise MixedCompositions(model.ref, f"slot {slot.id} already runs a worker of composition {other!r}; "
                                    f"one GPU takes one composition's worker (they would claim it twice)",
                                    f"set spec.compositionRef.name to {other!r}, or give it another "
                                    "spec.gpu.product")
        names = dict.fromkeys((model.name, *model.served_names))  # the name first, then the aliases, once each
        for name in names:
            taken = served_by.get((slot.id, name))
            if taken is not None:
                field = "metadata.name" if name == model.name else "spec.servedNames"
                raise ServedNameTaken(model.ref, f"the worker on slot {decision.slot} already serves the name "
                                      f"{name!r} for {taken}, so {model.ref}'s {field} {name!r} would be "
                                      "ambiguous (a worker serves each model name once)",
                                      f"change {field} of one of them, or give one another spec.gpu.product or "
                                      "compositionRef")
        served = _served(model, decision)
        composition_on[slot.id] = composition.name
        served_by.update({(slot.id, name): model.ref for name in names})
        workers[(slot, composition.name)].append(served)

    for decision in sorted(decisions, key=lambda d: d.key):
        _guarded(errors, place, decision)
    return workers, refused


def _serving_step(workers: Mapping[tuple[GpuSlot, str], list[_Served]],
                  compositions: Mapping[str, Composition], tree: _Tree, errors: list[ComposeError]) -> list[Decision]:
    """One worker per (slot, composition), then a Service per model it serves; the decisions fully rendered.
    A model whose Service cannot be rendered is left out of its worker; a worker whose name another
    (slot, composition) already took is refused (NameCollision) rather than merged into that one."""
    served, named = [], {}
    for (slot, name), members in sorted(workers.items(), key=lambda item: (item[0][0].id, item[0][1])):
        composition = compositions[name]
        try:
            context = _worker_context(slot, composition, members, named)
            services = _services(members, composition, context, errors)
            if len(services) < len(members):  # a model whose Service fails is not served by the worker either
                members = [m for m in members if m.model.ref in services]
                if not members:
                    continue
                context = _worker_context(slot, composition, members, named)
                services = _services(members, composition, context, errors)
            unit = _render(composition, composition.per_worker, context, members[0].model.ref)
            if slot.pool is not None:
                _require_gpu_request(unit, slot, composition, members[0].model.ref)
            tree.add(unit, list(services))
            tree.verdict_sources.add((context["worker"]["namespace"], context["worker"]["verdicts"]))
        except ComposeError as exc:
            errors.extend(exc.for_ref(m.model.ref) for m in members)
            continue
        for member in members:
            if _guarded(errors, lambda m: tree.add(services[m.model.ref], [m.model.ref]), member):
                served.append(member.decision)
                model = member.model  # its endpoint, when the composition rendered its Service in its namespace
                if f"{RENDERED}/{model.namespace}/service-{model.name}.yaml" in tree.objects:
                    tree.urls[model.ref] = model_url(model, int(composition.parameters["servicePort"]))
    return served


def _require_gpu_request(unit: Sequence[_File], slot: GpuSlot, composition: Composition, ref: str) -> None:
    """A pool node's worker must request nvidia.com/gpu: an autoscaler adds a GPU node only for a pending Pod
    that asks for one (the KAI composition shares GPUs by annotation and asks for none)."""
    for f in unit:
        if f.object is None or f.object.kind != "Deployment":
            continue
        containers = ((f.document.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or []
        if not any(GPU_RESOURCE in ((c.get("resources") or {}).get(kind) or {})
                   for c in containers for kind in ("limits", "requests")):
            raise PoolWorkerWithoutGpu(ref, f"the worker of {slot.id} (pool {slot.pool.name}) renders Deployment "
                                       f"{f.object.name} without a {GPU_RESOURCE} request (composition "
                                       f"{composition.name!r}), so no autoscaler would add the node it waits for",
                                       f"use a composition whose worker requests {GPU_RESOURCE} (default, hami) for "
                                       f"models on pools, or give the model a spec.gpu.product a fixed node has")


def _services(members: Sequence[_Served], composition: Composition, context: dict,
              errors: list[ComposeError]) -> dict[str, list[_File]]:
    """Each member's Service files, by its ref; a member whose Service fails is recorded in `errors`."""
    services = {}
    for member in members:
        try:
            services[member.model.ref] = _service(member.model, composition, context)
        except ComposeError as exc:
            errors.append(exc)
    return services


def _admit(item: Decision | Pending, by_key: Mapping, compositions: Mapping[str, Composition]):
    """The ElasticModel and composition of a decision or pending model, once its names are usable."""
    ref = f"{item.namespace}/{item.name}"
    for what, value in (("namespace", item.namespace), ("name", item.name)):
        if not is_dns_label(value):
            raise InvalidName(ref, f"{what} {value!r} is not a DNS-1123 label, so it can name no object or file",
                              "rename it: lowercase letters, digits and '-', at most 63 characters")
    model = by_key.get(item.key)
    if model is None:
        raise RenderFailed(ref, "the plan names a model that is not among the inputs",
                           "pass compose the same ElasticModels the plan was made from")
    composition = compositions.get(model.composition)
    if composition is None:
        raise UnknownComposition(ref, f"spec.compositionRef.name {model.composition!r} names no composition "
                                 f"(known: {', '.join(sorted(compositions))})",
                                 "use one of the known names or add the composition to templates/compositions/")
    outside = host_path_problem(composition.parameters, host_path_root())
    if outside:
        raise HostPathOutsideRoot(ref, f"composition {composition.name}: {outside[0]}", outside[1])
    return model, composition


def _slot(decision: Decision, slot_by_id: Mapping[str, GpuSlot]) -> GpuSlot:
    slot = slot_by_id.get(decision.slot or "")
    if slot is None:
        raise UnknownSlot(f"{decision.namespace}/{decision.name}", f"the decision places it on GPU slot "
                          f"{decision.slot!r}, which is not in the inventory", "plan and compose with the same slots")
    return slot


def _served(model: ElasticModel, decision: Decision) -> _Served:
    entry = model_entry(model, decision)
    problem = entry_problem(entry)
    if problem is not None:
        raise ManifestInvalid(model.ref, f"its worker.yaml entry breaks schemas/worker-config.schema.json: {problem}",
                              "fix the ElasticModel field named there")
    return _Served(model, decision, entry)


@dataclass(frozen=True)
class _ProfileRun:
    """What one profiler Job measures at: the profiler's --concurrency and --context-tokens."""

    concurrency: int = 1
    context_tokens: int = 1

    def widened(self, concurrency: int, context_tokens: int) -> _ProfileRun:
        return _ProfileRun(max(self.concurrency, concurrency), max(self.context_tokens, context_tokens))


def _profile_key(item: Pending) -> tuple[str, str, str, str, str]:
    return (item.namespace, item.model, item.revision, item.gpu_product, item.weight_dtype)


def _profiling(model: ElasticModel, pending: Pending, composition: Composition,
               beside: Beside | None, run: _ProfileRun) -> list[_File]:
    _require_label_values(model.ref, {"GPU product": pending.gpu_product})
    configmap = profile_configmap_name(pending.model, pending.revision, pending.gpu_product, pending.weight_dtype)
    pool = None if beside or pending.pool_selector is None else pending.pool_selector
    where = f"@{beside.slot.id}" if beside else f"@{pool[0]}={pool[1]}" if pool else ""
    context = {
        "params": composition.parameters,
        "model": _model_context(model) | {"model": pending.model, "revision": pending.revision},
        "job": {
            "name": profiler_job_name(pending.model, pending.revision, pending.gpu_product,  # where it runs is in
                                      str(composition.parameters["image"])  # its name: a Job is immutable
                                      + where, run.concurrency, run.context_tokens, pending.weight_dtype),
            "product": pending.gpu_product,
            "weightDtype": pending.weight_dtype,
            "concurrency": run.concurrency,
            "contextTokens": run.context_tokens,
            "configmap": configmap,
            "out": f"configmap:{model.namespace}/{configmap}",
            "beside": beside.context() if beside else None,
            "pool": {"key": pool[0], "value": pool[1]} if pool else None,  # the node label it selects instead
        },
    }
    return _render(composition, composition.profiling, context, model.ref)


def _worker_context(slot: GpuSlot, composition: Composition, members: list[_Served],
                    named: dict[str, tuple[str, str]]) -> dict:
    """What the worker templates of one (slot, composition) render from; its name is claimed in `named`."""
    ref = members[0].model.ref
    _require_label_values(ref, {"node name": slot.node, "GPU product": slot.product})
    name = worker_name(slot, composition.name)
    first = named.setdefault(name, (slot.id, composition.name))
    if first != (slot.id, composition.name):
        raise NameCollision(ref, f"the worker of GPU slot {slot.id} (composition {composition.name!r}) would be "
                            f"named {name!r}, which the worker of GPU slot {first[0]} (composition {first[1]!r}) "
                            "already has: the node, GPU index and composition of the two join into one name, so "
                            "they would be one worker",
                            f"rename one of the two: the node {slot.node!r} or {first[0].rsplit('/', 1)[0]!r} in "
                            "gpus.yaml (offline), or the composition (copy it under another metadata.name in "
                            f"compositions/ and point the models on {slot.id} at it with spec.compositionRef.name)")
    namespace = str(composition.parameters["workerNamespace"])
    verdicts = dns_label(name, "verdicts")
    try:
        config = dump(worker_config(slot, [m.entry for m in members], (namespace, verdicts)))
    except jsonschema.ValidationError as exc:
        raise ManifestInvalid(ref, f"worker.yaml for slot {slot.id} breaks schemas/worker-config.schema.json: "
                              f"{exc.message}", "fix the GPU inventory entry of that slot") from exc
    decisions = [m.decision for m in members]
    base_bytes = int(composition.parameters["workerBaseMemoryBytes"])
    host_bytes = base_bytes + sum(d.need_bytes for d in decisions if d.mode in ("swap", "elastic"))
    return {
        "params": composition.parameters,
        "worker": {
            "name": name,
            "namespace": namespace,
            "node": slot.node,
            "product": slot.product,
            "slot": slot.id,
            "capacity_bytes": slot.usable_bytes,  # worker.yaml's slot.capacityBytes: a change of it rolls the pod
            "config": config,
            "checksum": hashlib.sha256(config.encode()).hexdigest(),
            # the pod template takes nothing from the slot's models, so a model change never rolls the pod:
            "gpu_memory_mib": math.ceil(slot.memory_bytes / MIB),  # the slot's GPU share (the planner fills it)
            "host_memory": f"{math.ceil(base_bytes / MIB)}Mi",  # the fixed request the pod starts with
            "host_memory_need": f"{math.ceil(host_bytes / MIB)}Mi",  # resized in place (controller.kube.resize)
            "startup_failure_threshold": STARTUP_FAILURE_THRESHOLD,
            "verdicts": verdicts,
            "namespaces": sorted({m.model.namespace for m in members}),  # whose pods the NetworkPolicy admits
            # a pool node's GPU: the label its worker selects (and node is the plan's name for it), else None
            "pool": None if slot.pool is None else {"name": slot.pool.name, "key": slot.pool.selector[0],
                                                    "value": slot.pool.selector[1]},
            "progress_deadline_s": POOL_PROGRESS_DEADLINE_S,
        },
    }


def _service(model: ElasticModel, composition: Composition, worker_context: dict) -> list[_File]:
    params = composition.parameters
    name = service_name(model.namespace, model.name)
    context = worker_context | {"model": _model_context(model), "service": {
        "name": name,
        "target": f"{name}.{worker_context['worker']['namespace']}.svc.{params['clusterDomain']}",
        "url": model_url(model, int(params["servicePort"])),
    }}
    return _render(composition, composition.per_model, context, model.ref)


def model_url(model: ElasticModel, service_port: int) -> str:
    """The OpenAI base URL of a placed model, from any pod: its Service in its own namespace (status.url)."""
    port = "" if service_port == 80 else f":{service_port}"
    return f"http://{model.name}.{model.namespace}.svc{port}/v1"


NAMESPACE_SYNC_OPTIONS = "Prune=false,Delete=false"  # Argo CD never deletes a namespace it created for models


# Model namespaces hold profiler Jobs (no node directory: templates/_pod-cache-volume.j2) and Services: baseline is
# enforced, restricted audited and warned about. Worker namespaces are the install's (config/namespace.yaml):
# the tree never renders them, so it never fights their labels.
MODEL_NAMESPACE_POD_SECURITY = {"pod-security.kubernetes.io/enforce": "baseline",
                                "pod-security.kubernetes.io/audit": "restricted",
                                "pod-security.kubernetes.io/warn": "restricted"}


def _namespaces(tree: _Tree, install_owned: Collection[str]) -> None:
    """A Namespace object for each model namespace the tree writes into (rendered/<ns>/namespace-<ns>.yaml), so
    Argo CD creates it before the objects in it (sync wave -1) and never prunes or deletes it; never one of
    `install_owned` (the compositions' worker namespaces, which the install creates with its own labels)."""
    inside: dict[str, set[str]] = defaultdict(set)
    for path in tree.files:
        if path.startswith(f"{RENDERED}/"):
            inside[path.split("/")[1]].update(tree.owners[path])
    for namespace, refs in sorted(inside.items()):
        if namespace in install_owned:
            continue
        doc = {"apiVersion": "v1", "kind": "Namespace", "metadata": {
            "name": namespace,
            "labels": {"app.kubernetes.io/managed-by": "gpushare", **MODEL_NAMESPACE_POD_SECURITY},
            "annotations": {"argocd.argoproj.io/sync-options": NAMESPACE_SYNC_OPTIONS,
                            "argocd.argoproj.io/sync-wave": "-1"}}}
        path = _safe_path(sorted(refs)[0] if refs else namespace, RENDERED, namespace, f"namespace-{namespace}.yaml")
        tree.files[path] = dump(doc)
        tree.owners[path].update(refs)
        tree.objects[path] = RenderedObject("Namespace", "", namespace)


def _model_context(model: ElasticModel) -> dict:
    return {"name": model.name, "namespace": model.namespace, "model": model.model, "revision": model.revision,
            "ref": model.ref}


def _require_label_values(ref: str, values: Mapping[str, str]) -> None:
    for what, value in values.items():
        if not is_label_value(value):
            raise InvalidName(ref, f"{what} {value!r} is not a valid Kubernetes label value, so no selector can "
                              "match it", "use at most 63 letters, digits, '-', '_' or '.', alphanumeric at both ends")


def _render(composition: Composition, templates: Sequence[str], context: Mapping, ref: str) -> list[_File]:
    unit = []
    for template in templates:
        try:
            docs = render_documents(compiled(composition.templates), template, context)
        except RenderError as exc:
            raise RenderFailed(ref, f"composition {composition.name}: {exc}",
                               "fix the template; every printed value must pass through `| quote`") from exc
        unit.extend(_object_file(doc, canonical, ref, f"{composition.name}/{template}", composition, context)
                    for doc, canonical in docs)
    return unit


def _object_file(doc: dict, canonical: str | None, ref: str, origin: str, composition: Composition,
                 context: Mapping) -> _File:
    """The checked path and canonical text (`canonical`, or written here) of one rendered object: valid against
    Kubernetes' schema and the rules the API server applies beyond it (controller.inputs.kube_rules)."""
    metadata = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    name, namespace = metadata.get("name"), metadata.get("namespace")
    what = f"{origin}: {doc.get('kind')} {namespace}/{name}"
    if not (isinstance(name, str) and isinstance(namespace, str) and is_dns_label(name) and is_dns_label(namespace)):
        raise ManifestInvalid(ref, f"{what}: metadata.name and metadata.namespace must be DNS-1123 labels",
                              "render namespaced objects named by controller.rendering.names")
    try:
        validate_object(doc)
    except jsonschema.ValidationError as exc:
        where = ".".join(str(p) for p in exc.absolute_path) or "(root)"
        raise ManifestInvalid(ref, f"{what}: {where}: {exc.message} (Kubernetes {KUBERNETES_VERSION} schema)",
                              "fix the template that renders this object") from exc
    except NoSchema as exc:
        raise ManifestInvalid(ref, f"{what}: {exc}", "compositions may render built-in Kubernetes kinds only") from exc
    problems = object_problems(doc)
    if problems:
        raise _refused(problems, ref, what, origin, composition, context)
    return _File(_safe_path(ref, RENDERED, namespace, f"{doc['kind'].lower()}-{name}.yaml"),
                 dump(doc) if canonical is None else canonical,
                 RenderedObject(doc["kind"], namespace, name), doc)


def _refused(problems: Sequence[Problem], ref: str, what: str, origin: str, composition: Composition,
             context: Mapping) -> ComposeError:
    """The typed error of an object the API server would refuse: every broken rule (the first three), and the
    fix named after the input the first offending value came from."""
    shown = "; ".join(f"{p.where} {_shown(p.value)}: {p.message}" for p in problems[:3])
    more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
    source = _source(problems[0].value, composition, context)
    fix = (f"change {source}" if source else f"fix the template {origin} that renders it") + \
        " to a value Kubernetes accepts (docs/limits.md, \"Rendered objects\")"
    return RULE_ERRORS[problems[0].reason](ref, f"{what}: the Kubernetes API server would refuse it: {shown}{more}",
                                           fix)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:60]}…"


def _source(value: object, composition: Composition, context: Mapping) -> str | None:
    """The input a rendered value came from, named as its user edits it: a composition parameter, a field of
    the ElasticModel, or the GPU inventory; None when no input holds it (the template wrote it)."""
    text = str(value)
    where = composition.source or f"the shipped composition {composition.name!r}"
    for name, parameter in sorted(composition.parameters.items()):
        for path, leaf in _leaves(parameter, f"spec.parameters.{name}"):
            if str(leaf) == text:
                return f"{path} in {where}"
    model = context.get("model")
    if isinstance(model, Mapping):
        for field, spelled in (("name", "metadata.name"), ("namespace", "metadata.namespace"), ("model", "spec.model")):
            if model.get(field) == text:
                return f"{spelled} of the ElasticModel {model['ref']}"
    worker = context.get("worker")
    if isinstance(worker, Mapping) and text in (worker.get("node"), worker.get("product")):
        return f"the node name or GPU product of slot {worker['slot']} (gpus.yaml, or the cluster's Node)"
    return None


def _leaves(value: object, at: str):
    """(path, scalar) of every scalar, and every mapping key, inside a parameter's value."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield f"{at}.{key}", key
            yield from _leaves(item, f"{at}.{key}")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from _leaves(item, f"{at}[{i}]")
    elif value is not None:
        yield at, value


def _safe_path(ref: str, root: str, *parts: str) -> str:
    """root/part/...; every part a plain DNS-style name, the result provably inside root."""
    for part in parts:
        if not _PATH_PART.match(part) or ".." in part:
            raise InvalidName(ref, f"{part!r} cannot be part of an output path", "use a DNS-1123 name")
    path = posixpath.normpath(posixpath.join(root, *parts))
    if not path.startswith(root + "/"):
        raise InvalidName(ref, f"{path!r} leaves {root}/", "use a DNS-1123 name")
    return path


def _decision_file(decision: Decision, model: ElasticModel) -> _File:
    """decisions/<ns>/<name>.yaml: the decision, beside the spec it was made from (the model's last
    good spec, which a later pass serves from if the model's file breaks)."""
    ref = f"{decision.namespace}/{decision.name}"
    return _File(_safe_path(ref, DECISIONS, decision.namespace, f"{decision.name}.yaml"), dump(
        {**model_to_doc(model), "status": {"assigned": decision_to_dict(decision)}}))
