"""The inputs of one pass, read from a checked-out GitOps repository and checked one way for every command.

Owns `read_repo`: models/**, profiles/**, gpus.yaml (or the cluster's slots), compositions/**
(over the shipped ones), the last good copy of each input file, then `check_inputs`, the
cross-document check: a model's compositionRef must name a composition. `gpushare validate`, `plan`, `explain`, offline and cluster
reconcile all go through `read_repo`, so validate refuses exactly what reconcile refuses.
A model whose composition is unknown counts as broken: it is served from its last good spec.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from controller.compositions import Composition, read_repo_compositions
from controller.load import TreeRead, combine, read_inventory, read_models, read_profile_tree
from controller.types import GpuSlot, InputError, Inputs, Profile


@dataclass(frozen=True)
class RepoInputs:
    """What a pass reads: the checked inputs, the compositions by name, and the input files' last good copies."""

    inputs: Inputs
    compositions: Mapping[str, Composition]
    last_good: Mapping[str, str]  # decisions/_last-good/<path> -> text, written by the pass
    held: tuple[str, ...] = ()  # input files broken now and read from their last good copy


def read_repo(root: Path, *, slots: Sequence[GpuSlot] | None = None, measured: Iterable[Profile] = (),
              replaced: frozenset[str] = frozenset(), errors: Iterable[InputError] = ()) -> RepoInputs:
    """The pass's inputs from `root`. Cluster mode passes the nodes' `slots` (gpus.yaml is then not read),
    the `measured` profiles of its ConfigMaps, the git profile files they `replaced`, and the `errors`
    found in the cluster."""
    root = Path(root)
    models, model_errors = read_models(root)
    profiles = read_profile_tree(root)
    inventory = read_inventory(root) if slots is None else TreeRead(values=list(slots))
    compositions = read_repo_compositions(root)
    git_profiles = [p for p in profiles.values if p.file not in replaced]
    inputs = combine(models, [*git_profiles, *measured], inventory.values,
                     [*model_errors, *(e for e in profiles.errors if e.file not in replaced), *inventory.errors,
                      *compositions.read.errors, *errors])
    read = TreeRead().add(profiles).add(inventory).add(compositions.read)
    last_good = {path: text for path, text in read.last_good.items()
                 if not any(path.endswith("/" + file) for file in replaced)}
    return RepoInputs(check_inputs(inputs, compositions.compositions), compositions.compositions, last_good,
                      tuple(sorted(read.held)))


def check_inputs(inputs: Inputs, compositions: Mapping[str, Composition]) -> Inputs:
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
            source.file if source else "models/", source.document if source else None, "spec.compositionRef.name",
            reason="UnknownComposition", object=model.ref,
            message=f"spec.compositionRef.name {model.composition!r} names no composition "
                    f"(known: {', '.join(sorted(compositions))})",
            fix="use one of the known names, or add compositions/<name>.yaml to the repository"))
    return replace(inputs, models=tuple(models), errors=tuple(errors))
