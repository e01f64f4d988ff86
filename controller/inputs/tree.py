"""What the one reader returns: a GitOps tree as read (`Tree`) and what the last pass left in it (`LastPass`).

Owns the two values a pass takes whole: the parsed inputs (models, profiles, slots, pools, compositions,
right-sizing records and prices, each file's last good copy) and the last pass's result (its decisions
with the specs they were made from, its PLAN.md, each model's generated paths, every generated path, the
worker objects it rendered). `Tree.combined` checks the inputs across documents (`check_inputs`); cluster
mode swaps in the nodes' slots and adds its measured profiles first. Pure: built by
controller.inputs.reader, taken by controller.passes.reconcile.run_pass, `gpushare plan`, `validate`,
`explain` and the right-sizing pass.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from controller.inputs.layout import SINGLE, Layout
from controller.inputs.load import DecisionRecord, combine, revive_last_good
from controller.inputs.rightsizing_records import Records
from controller.types import Decision, ElasticModel, GpuSlot, InputError, Inputs, Pool, Profile


@dataclass(frozen=True)
class LastPass:
    """The last pass's result as the tree holds it. `paths` and `workers` are None when not known (then every
    profiler Job counts as created and no worker is compared)."""

    records: Mapping[tuple[str, str], DecisionRecord] = field(default_factory=dict)  # decisions/<ns>/<name>.yaml
    plan_md: str | None = None  # rendered/PLAN.md
    owners: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # namespace/name -> its generated paths
    paths: tuple[str, ...] | None = None  # every file under the controller's prefixes
    workers: Mapping[str, str] | None = None  # the rendered worker Deployments and ConfigMaps (path -> text)

    @property
    def previous(self) -> dict[tuple[str, str], Decision]:
        return {key: record.decision for key, record in self.records.items()}


@dataclass(frozen=True)
class Tree:
    """A checked-out GitOps tree, parsed but not yet combined, and the last pass it holds."""

    models: tuple[ElasticModel, ...]  # Auto's effective budgets applied (controller.inputs.rightsizing_records)
    model_errors: tuple[InputError, ...]
    profiles: tuple[Profile, ...]
    profile_errors: tuple[InputError, ...]
    slots: tuple[GpuSlot, ...]
    slot_errors: tuple[InputError, ...]
    measured_profiles: Mapping[str, str] = field(default_factory=dict)  # profiles/measured/** as committed
    compositions: Mapping[str, Any] = field(default_factory=dict)  # name -> inputs.compositions.Composition
    composition_errors: tuple[InputError, ...] = ()
    last_good: Mapping[str, str] = field(default_factory=dict)  # decisions/_last-good/<path> -> text
    held: tuple[str, ...] = ()  # input files broken now and read from their last good copy
    rightsizing: Records = field(default_factory=Records)  # decisions/rightsizing/, with the files that failed
    prices: Mapping[str, float] = field(default_factory=dict)  # gpus.yaml pricePerGpuHour
    last: LastPass = LastPass()
    pools: tuple[Pool, ...] = ()  # gpus.yaml pools (cluster mode plans them too)
    layout: Layout = SINGLE  # whose tree: the single-cluster layout, or one cluster's paths under clusters/
    shared_profiles: tuple[Profile, ...] = ()  # other clusters' measured profiles, for keys this one has not measured
    clusters: tuple[str, ...] = ()  # with clusters/: every cluster of the repository

    def combined(self, slots: Iterable[GpuSlot] | None = None, measured: Iterable[Profile] = (),
                 replaced: frozenset[str] = frozenset(), errors: Iterable[InputError] = (),
                 pools: Iterable[Pool] | None = None, pool_nodes: Iterable[tuple[str, int]] = ()) -> Inputs:
        """The checked inputs (`check_inputs`). Cluster mode passes the nodes' `slots` (gpus.yaml's nodes are
        then not used, and their errors not reported; its pools are), its `measured` profiles, the git profile
        files they `replaced`, its `errors`, the `pools` it plans (gpus.yaml's, less any whose node names a Node
        takes) and how many nodes each has (`pool_nodes`). Another cluster's measured profile is used for a
        profile key this cluster has measured none of (one GPU product behaves alike in every cluster: profiled
        once, used everywhere)."""
        slot_errors = self.slot_errors if slots is None else [e for e in self.slot_errors
                                                             if e.path.startswith("pools[")]
        own = [*(p for p in self.profiles if p.file not in replaced), *measured]
        mine = {p.key for p in own if p.source == "measured"}
        inputs = combine(self.models, [*own, *(p for p in self.shared_profiles if p.key not in mine)],
                         self.slots if slots is None else slots,
                         [*self.model_errors, *(e for e in self.profile_errors if e.file not in replaced),
                          *slot_errors, *self.composition_errors, *errors],
                         self.pools if pools is None else pools, pool_nodes, self.prices)
        return check_inputs(inputs, self.compositions)

    @cached_property
    def inputs(self) -> Inputs:
        """The checked inputs of the tree as it stands (offline: gpus.yaml's slots, git's profiles)."""
        return self.combined()

    def planned(self) -> tuple[Inputs, tuple[str, ...]]:
        """The inputs a pass plans: valid models plus the last good spec of each broken one."""
        return revive_last_good(self.inputs, self.last.records)

    def last_good_except(self, replaced: frozenset[str]) -> dict[str, str]:
        """The last good copies to write, less those of git files the cluster's copies replace."""
        return {path: text for path, text in self.last_good.items()
                if path.split("/", 2)[-1] not in replaced}


def check_inputs(inputs: Inputs, compositions: Mapping[str, Any]) -> Inputs:
    """The cross-document check: a model naming an unknown composition is an InputError and is left out of
    the inputs (so a pass serves it from its last good spec)."""
    errors = list(inputs.errors)
    models = []
    for model in inputs.models:
        if model.composition in compositions:
            models.append(model)
            continue
        source = model.source
        errors.append(InputError(
            source.file if source else "models/", source.document if source else None,
            "spec.compositionRef.name", reason="UnknownComposition", object=model.ref,
            message=f"spec.compositionRef.name {model.composition!r} names no composition "
                    f"(known: {', '.join(sorted(compositions))})",
            fix="use one of the known names, or add compositions/<name>.yaml to the repository"))
    return replace(inputs, models=tuple(models), errors=tuple(errors))
