"""`spec.placement` of an ElasticModel: which clusters of a many-cluster repository run it.

Owns the value and its one matching rule, in the placement vocabulary of Karmada and Open Cluster
Management: `clusters` (cluster names) and `clusterSelector` (a Kubernetes LabelSelector, `matchLabels`
and `matchExpressions` with In, NotIn, Exists, DoesNotExist, over the labels each cluster declares in
`clusters/<name>/gpus.yaml`). A cluster is selected when it is named (if `clusters` is given) and its labels
match the selector (if one is given), both as Karmada's ClusterAffinity reads them; no placement at all
selects every cluster (Karmada's propagation without affinity). An empty selector matches every cluster, as
an empty LabelSelector matches every object. The schema (schemas/elasticmodel.schema.json) checks the shape
first; `parse_placement` builds the value and reports what the schema cannot see (values given to Exists, none
given to In). It sits below controller.types (an ElasticModel carries its placement); parsed by
controller.inputs.load, checked against the repository's clusters by controller.inputs.clusters.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


class PlacementError(ValueError):
    """A placement the schema accepts but that selects by a rule Kubernetes refuses; `path` is the field."""

    reason = "InvalidSelector"

    def __init__(self, path: str, message: str):
        super().__init__(message)
        self.path = path


@dataclass(frozen=True)
class Requirement:
    """One of a LabelSelector's matchExpressions."""

    key: str
    operator: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "Exists":
            return self.key in labels
        if self.operator == "DoesNotExist":
            return self.key not in labels
        inside = self.key in labels and labels[self.key] in self.values
        return inside if self.operator == "In" else not inside


@dataclass(frozen=True)
class Selector:
    """A Kubernetes LabelSelector: every matchLabels pair and every expression must hold."""

    match_labels: tuple[tuple[str, str], ...] = ()
    expressions: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return (all(labels.get(key) == value for key, value in self.match_labels)
                and all(requirement.matches(labels) for requirement in self.expressions))


@dataclass(frozen=True)
class Placement:
    """`clusters`: the names given (None: any name); `selector`: the clusterSelector (None: any labels)."""

    clusters: tuple[str, ...] | None = None
    selector: Selector | None = None

    def selects(self, cluster: str, labels: Mapping[str, str]) -> bool:
        return ((self.clusters is None or cluster in self.clusters)
                and (self.selector is None or self.selector.matches(labels)))


EVERYWHERE = Placement()


def parse_placement(spec: Any) -> Placement:
    """spec.placement of a schema-valid document (None when absent); PlacementError on an expression whose
    values do not suit its operator (In and NotIn need values, Exists and DoesNotExist take none)."""
    if not isinstance(spec, dict):
        return EVERYWHERE
    clusters = spec.get("clusters")
    selector = spec.get("clusterSelector")
    return Placement(None if clusters is None else tuple(dict.fromkeys(clusters)),
                     None if selector is None else _selector(selector))


def _selector(doc: dict) -> Selector:
    expressions = []
    for i, item in enumerate(doc.get("matchExpressions") or ()):
        values = tuple(item.get("values") or ())
        at = f"spec.placement.clusterSelector.matchExpressions[{i}]"
        if item["operator"] in ("In", "NotIn") and not values:
            raise PlacementError(f"{at}.values", f"operator {item['operator']} needs at least one value")
        if item["operator"] in ("Exists", "DoesNotExist") and values:
            raise PlacementError(f"{at}.values", f"operator {item['operator']} takes no values")
        expressions.append(Requirement(item["key"], item["operator"], values))
    labels = tuple(sorted((str(k), str(v)) for k, v in (doc.get("matchLabels") or {}).items()))
    return Selector(labels, tuple(expressions))
