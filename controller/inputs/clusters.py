"""The clusters of a many-cluster repository, and which ElasticModels each of them plans.

Owns `Catalog` (every folder under clusters/ with its labels, and what is wrong with the folders:
a name that is no DNS-1123 label, a folder without gpus.yaml, labels Kubernetes refuses, a root
gpus.yaml beside clusters/) and `placed`: the models one cluster plans (those whose spec.placement
selects it, controller.placement), with an error on each model whose placement names a cluster the
repository lacks or selects none at all. A model with such an error is planned nowhere, as any broken
model: each cluster that ran it serves it from its last good spec (controller.inputs.load.revive_last_good),
so a typo in a placement never takes a model down. In the single-cluster layout (no clusters/) a model
with spec.placement is such an error too: there is no cluster to select. A model under clusters/<name>/models/
runs in that cluster alone (only its controller reads that folder), so a placement there is an error as well.
`Elsewhere` tells the reader which files and broken models under models/ are other clusters' alone: it reads
them no further, and reports none of their errors. Pure: the reader (controller.inputs.reader) lists the
folders and reads the labels; every pass, `validate`, `plan` and `explain` select through here.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import astuple, dataclass, field
from typing import Any

import yaml

from controller.inputs.kube_rules import dns1123_label
from controller.inputs.layout import CLUSTERS_DIR, INVENTORY_FILE, MODELS_DIR
from controller.inputs.load import placement_of
from controller.inputs.placement_probe import placement_blocks
from controller.inputs.yaml_limits import YamlLimits
from controller.inputs.yamlin import parse_documents
from controller.placement import EVERYWHERE, Placement
from controller.types import ElasticModel, InputError

NO_CLUSTER_FIX = f"add {CLUSTERS_DIR}/<name>/{INVENTORY_FILE} for the cluster (its folder name is its name)"


@dataclass(frozen=True)
class Catalog:
    """The repository's clusters: name -> its labels (None while its gpus.yaml cannot be read), and the errors
    of the folders under clusters/ (a folder with an error is no cluster)."""

    labels: Mapping[str, Mapping[str, str] | None]
    errors: tuple[InputError, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self.labels))

    def shown(self) -> str:
        """Each cluster with its labels, for a message: `eu-1 {region=eu}, us-1 {}`."""
        def labels(name: str) -> str:
            found = self.labels[name]
            return "labels unreadable" if found is None else ",".join(f"{k}={v}" for k, v in sorted(found.items()))
        return ", ".join(f"{name} {{{labels(name)}}}" for name in self.names) or "none"


def cluster_name_problem(name: str) -> str | None:
    """Why `name` cannot name a cluster (it names its folder, paths and Argo CD destination), or None."""
    problems = dns1123_label(name)
    return problems[0] if problems else None


def placed(models: Iterable[ElasticModel], cluster: str | None, catalog: Catalog | None
           ) -> tuple[list[ElasticModel], list[InputError]]:
    """(the models `cluster` plans, the placement error of each model that no cluster plans). `catalog` None:
    the single-cluster layout, which plans every model without a placement."""
    kept, errors = [], []
    selected: dict[Placement, tuple[str, ...]] = {}  # a fleet repeats few placements: each is evaluated once
    own = f"{CLUSTERS_DIR}/{cluster}/"
    for model in models:
        if cluster is not None and model.source is not None and model.source.file.startswith(own):
            problem = _placed_at_all(model, "PlacementInClusterFolder",
                                     f"{model.source.file} is in {own}, so it runs in cluster {cluster} alone; "
                                     "spec.placement cannot send it elsewhere",
                                     "remove spec.placement, or move the model to models/ to place it on "
                                     "several clusters")
        elif catalog is None:
            problem = _placed_at_all(model, "PlacementWithoutClusters",
                                     f"spec.placement selects clusters, but the repository has no {CLUSTERS_DIR}/ "
                                     "folder: it is one implicit cluster, which plans every model",
                                     f"remove spec.placement, or move {INVENTORY_FILE} to "
                                     f"{CLUSTERS_DIR}/<name>/{INVENTORY_FILE} for each cluster")
        else:
            problem = _problem(model, catalog)
            if problem is None and model.placement not in selected:
                selected[model.placement] = _selected(model.placement, catalog)
            if problem is None and cluster not in selected[model.placement]:
                continue
        if problem is None:
            kept.append(model)
        else:
            errors.append(problem)
    return kept, errors


def _placed_at_all(model: ElasticModel, reason: str, message: str, fix: str) -> InputError | None:
    """The error of a model that may take no placement (it has one), or None."""
    return None if model.placement == EVERYWHERE else _error(model, "spec.placement", reason, message, fix)


def _selected(placement: Placement, catalog: Catalog) -> tuple[str, ...]:
    return tuple(name for name in catalog.names if placement.selects(name, catalog.labels[name] or {}))


def elsewhere(placement: Placement, cluster: str, catalog: Catalog) -> bool:
    """Whether `placement` runs a model on other clusters of `catalog` only, and is no error in any of them: such a
    model is not `cluster`'s to read further, plan or report on (its own clusters do)."""
    return _unplaced(placement, catalog) is None and cluster not in _selected(placement, catalog)


@dataclass
class Elsewhere:
    """Which ElasticModels under models/ are another cluster's business alone, for `cluster`'s reader: a file whose
    every document (found by controller.inputs.placement_probe) has a spec.placement that `elsewhere` holds is not
    read further (`file`), and a broken document whose placement holds it is not `cluster`'s error (`document`):
    its own clusters report it, as `validate` over the whole repository does. Everything it cannot be sure of is
    read and reported as before. Each distinct placement text is judged once (a fleet repeats few)."""

    cluster: str
    catalog: Catalog
    _judged: dict[str, bool] = field(default_factory=dict)

    def file(self, rel: str, text: str) -> bool:
        """Whether the file `rel` of `text` under models/ holds models placed on other clusters only."""
        if not rel.startswith(MODELS_DIR + "/"):
            return False  # a cluster's own folder: every model there is its own, placed or not (an error)
        blocks = placement_blocks(text)
        return bool(blocks) and all(self._block(block) for block in set(blocks))

    def facts(self) -> list:
        """What its verdicts depend on beyond a file's text and the code (a key for remembering them): the cluster,
        every cluster's labels, the YAML limits."""
        labels = [[name, None if self.catalog.labels[name] is None else dict(self.catalog.labels[name])]
                  for name in self.catalog.names]
        return [self.cluster, labels, list(astuple(YamlLimits.from_env()))]

    def document(self, doc: Any) -> bool:
        """Whether one parsed document has a spec.placement that runs it on other clusters only."""
        spec = doc.get("spec") if isinstance(doc, dict) else None
        if not isinstance(spec, dict) or "placement" not in spec:
            return False
        placement = placement_of(spec["placement"])
        return placement is not None and elsewhere(placement, self.cluster, self.catalog)

    def _block(self, block: str) -> bool:
        judged = self._judged.get(block)
        if judged is None:
            judged = self._judged[block] = self._judge(block)
        return judged

    def _judge(self, block: str) -> bool:
        if not block:
            return False  # no placement: every cluster runs it
        try:
            found = parse_documents(block, unique_keys=True, limits=YamlLimits.from_env())
        except (yaml.YAMLError, RecursionError, ValueError, OverflowError):
            return False
        if len(found) != 1 or not isinstance(found[0], dict) or list(found[0]) != ["placement"]:
            return False
        return self.document({"spec": found[0]})


def _problem(model: ElasticModel, catalog: Catalog) -> InputError | None:
    found = _unplaced(model.placement, catalog)
    return None if found is None else _error(model, *found)


def _unplaced(placement: Placement, catalog: Catalog) -> tuple[str, str, str, str] | None:
    """(field, reason, message, fix) of a placement that names a cluster the repository lacks or selects none."""
    for i, name in enumerate(placement.clusters or ()):
        if name not in catalog.labels:
            return (f"spec.placement.clusters[{i}]", "UnknownCluster",
                    f"cluster {name!r} is not in the repository (clusters: {', '.join(catalog.names) or 'none'})",
                    f"name one of those, or {NO_CLUSTER_FIX}")
    if _selected(placement, catalog) or any(labels is None for labels in catalog.labels.values()):
        return None  # a cluster whose labels cannot be read now might match: no verdict until it is fixed
    where = "spec.placement.clusterSelector" if placement.selector is not None else "spec.placement"
    return (where, "NoClusterSelected",
            f"spec.placement selects no cluster (clusters and their labels: {catalog.shown()})",
            "change the selector or the cluster names, or label a cluster in its "
            f"{CLUSTERS_DIR}/<name>/{INVENTORY_FILE} (`labels:`)")


def _error(model: ElasticModel, path: str, reason: str, message: str, fix: str) -> InputError:
    source = model.source
    return InputError(source.file if source else "models/", source.document if source else None, path, message, fix,
                      reason=reason, object=model.ref)


def inventory_path(cluster: str) -> str:
    return f"{CLUSTERS_DIR}/{cluster}/{INVENTORY_FILE}"


def folder_errors(folders: Sequence[str], has_inventory: Mapping[str, bool], root_inventory: bool) -> list[InputError]:
    """What is wrong with the folders under clusters/ (each named, with or without its gpus.yaml) and a root
    gpus.yaml beside them. A folder with an error is no cluster."""
    errors = []
    if root_inventory:
        errors.append(InputError(INVENTORY_FILE, None, "", reason="TwoLayouts",
                                 message=f"the repository has both {INVENTORY_FILE} and {CLUSTERS_DIR}/: with "
                                         f"{CLUSTERS_DIR}/ each cluster's inventory is {CLUSTERS_DIR}/<name>/"
                                         f"{INVENTORY_FILE}, and {INVENTORY_FILE} is not read",
                                 fix=f"move {INVENTORY_FILE} to {CLUSTERS_DIR}/<name>/{INVENTORY_FILE} (git mv), or "
                                     f"remove {CLUSTERS_DIR}/ to keep one implicit cluster"))
    for name in folders:
        problem = cluster_name_problem(name)
        if problem is not None:
            errors.append(InputError(f"{CLUSTERS_DIR}/{name}/", None, "", reason="InvalidClusterName",
                                     message=f"{name!r} cannot name a cluster: {problem}; the folder is ignored",
                                     fix="rename the folder to a DNS-1123 label (the name of the cluster's Argo CD "
                                         "cluster secret), e.g. eu-1"))
        elif not has_inventory[name]:
            errors.append(InputError(inventory_path(name), None, "", reason="MissingInventory",
                                     message=f"{CLUSTERS_DIR}/{name}/ holds no {INVENTORY_FILE}, so it is no cluster",
                                     fix=f"add {inventory_path(name)} (a GPUInventory: its nodes, labels and prices; "
                                         "`nodes: []` for a cluster whose controller reads its Nodes)"))
    if not folders:
        errors.append(InputError(f"{CLUSTERS_DIR}/", None, "", reason="NoClusters",
                                 message=f"{CLUSTERS_DIR}/ holds no cluster folder, so no model is planned anywhere",
                                 fix=NO_CLUSTER_FIX))
    return errors
