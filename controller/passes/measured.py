"""Cluster mode's facts and the profiles it commits: what the API server adds to a pass over the tree.

Owns `ClusterFacts` (what the API server said before git is read: GPU slots from node labels, every
GPU node's labels (which pool it belongs to), profile ConfigMaps, the problems found in them) and `measured_profiles`: profile ConfigMaps ->
profiles filed under `profiles/measured/` with the exact text committed there, so a decision can be
replayed offline from git; only a ConfigMap our profiler Job writes for a model in git is used
(`profile_requests`). Pure. Called by controller.passes.reconcile.run_pass (given facts, in cluster
mode) and controller.cli.cluster_loop (which gathers the facts).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import yaml

from contract.estimate import profile_relpath
from controller.inputs.layout import MEASURED_PROFILES_DIR
from controller.inputs.load import load_documents, parse_profile
from controller.observe.facts import ProfileDocument
from controller.rendering.names import profile_configmap_name
from controller.types import ElasticModel, GpuSlot, InputError, Pool, Profile

MEASURED_DIR = f"{MEASURED_PROFILES_DIR}/"
MEASURED_HEADER = ("# Published by a gpushare profiler Job as a ConfigMap and committed by the controller; "
                   "do not edit by hand.\n")

@dataclass(frozen=True)
class ClusterFacts:
    """The API server's answers that feed the pass (equal facts and unmoved git: nothing to render)."""

    slots: tuple[GpuSlot, ...]
    profiles: tuple[ProfileDocument, ...]
    errors: tuple[InputError, ...] = ()
    pod_monitors: bool = False  # the API server serves monitoring.coreos.com/v1 PodMonitor (API discovery)
    node_labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # node -> labels (its pool)


@dataclass(frozen=True)
class ProfileRequest:
    """What the profiler Job the controller renders for a model in git writes into its ConfigMap."""

    model: str
    revision: str
    gpu_product: str
    weight_dtype: str = "auto"


def profile_requests(models: Sequence[ElasticModel], slots: Sequence[GpuSlot], pools: Sequence[Pool] = ()
                     ) -> dict[tuple[str, str], ProfileRequest]:
    """(namespace, ConfigMap name) -> the profile expected there: for each model in git, on its GPU product
    (or each product the nodes and the pools offer), in the model's namespace under
    controller.rendering.names.profile_configmap_name."""
    products = sorted({slot.product for slot in slots} | {pool.product for pool in pools})
    requests = {}
    for model in models:
        for product in [model.gpu_product] if model.gpu_product else products:
            name = profile_configmap_name(model.model, model.revision, product, model.weight_dtype)
            requests[(model.namespace, name)] = ProfileRequest(model.model, model.revision, product,
                                                               model.weight_dtype)
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


def measured_path(profile: Profile, directory: str = MEASURED_PROFILES_DIR) -> str:
    """profiles/measured/<gpu-product>/<model-slug>.yaml, with `@<revision>` before .yaml unless it is main,
    so two revisions of one model do not overwrite each other; with clusters/, under the cluster's own
    `directory` (profiles/measured/<cluster>/), so two clusters' controllers never commit one file."""
    relpath = profile_relpath(profile.model, profile.gpu_product, profile.weight_dtype)
    if profile.revision == "main":
        return f"{directory}/{relpath}"
    return f"{directory}/{relpath.removesuffix('.yaml')}@{profile.revision.replace('/', '--')}.yaml"


def measured_profiles(documents: Sequence[ProfileDocument], requests: Mapping[tuple[str, str], ProfileRequest],
                      directory: str = MEASURED_PROFILES_DIR) -> MeasuredProfiles:
    """Each valid profile of each requested ConfigMap, filed at `measured_path` under `directory`.

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
            found = ProfileRequest(profile.model, profile.revision, profile.gpu_product, profile.weight_dtype)
            if found != request:
                ignored.append(("ProfileMismatch", f"{document.ref} document {index} profiles {found.model}@"
                                f"{found.revision} on {found.gpu_product} ({found.weight_dtype}), but that ConfigMap "
                                f"is where the profile of {request.model}@{request.revision} on "
                                f"{request.gpu_product} ({request.weight_dtype}) belongs; ignored"))
                continue
            path = measured_path(profile, directory)
            if path in files:
                continue
            files[path] = MEASURED_HEADER + yaml.safe_dump(doc, sort_keys=True, allow_unicode=True, width=4096)
            profiles.append(replace(profile, file=path))
            sources[path] = document.ref
    return MeasuredProfiles(files, tuple(profiles), sources, tuple(errors), tuple(ignored))
