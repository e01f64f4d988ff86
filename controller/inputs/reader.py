"""The one reader of a GitOps directory: what every command and loop plans from.

Owns reading a checked-out tree into parsed inputs: ElasticModels under
models/**, profiles under profiles/**, gpus.yaml, the decision records under
decisions/ (each decision with the last good spec it was made from) and the last
rendered/PLAN.md. `read_repo` is used by `gpushare validate`, `plan` and
`explain`, by offline passes and (with the cluster's own facts swapped in) by
cluster passes, so they all plan from the same inputs, last good specs revived
alike (`RepoSnapshot.planned`).

The only I/O of the input stage; the parsers it calls (controller.inputs.load)
are pure.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import yaml

from contract.wire import SOURCE_ANNOTATION
from controller.inputs.layout import (DECISIONS_DIR, INVENTORY_FILE, MEASURED_PROFILES_DIR, MODELS_DIR, PLAN_MD,
                                      PROFILES_DIR, RENDERED_DIR)
from controller.inputs.load import (YAML_SUFFIXES, DecisionRecord, Documents, load_documents,
                                    TreeInputs, parse_inventory, parse_model, parse_profile, revive_last_good)
from controller.rightsizing.prices import read_prices
from controller.rightsizing.records import effective_models, read_records
from controller.serialize import decision_from_dict
from controller.types import Decision, ElasticModel, GpuSlot, InputError, Inputs, Profile, Source


@dataclass(frozen=True)
class RepoSnapshot:
    """A GitOps tree as read: the inputs (before reviving), the last decisions and PLAN.md."""

    inputs: Inputs
    records: Mapping[tuple[str, str], DecisionRecord]
    last_plan_md: str | None
    tree: TreeInputs | None = None  # as read: right-sizing records, prices, the last rendered workers

    @property
    def previous(self) -> dict[tuple[str, str], Decision]:
        return {key: record.decision for key, record in self.records.items()}

    def planned(self) -> tuple[Inputs, tuple[str, ...]]:
        """The inputs a pass plans: valid models plus the last good spec of each broken one."""
        return revive_last_good(self.inputs, self.records)


def read_repo(root: Path) -> RepoSnapshot:
    """Everything a pass reads from a GitOps directory. Other trees are ignored; files are read sorted."""
    tree = read_tree(root)
    return RepoSnapshot(tree.combined(), tree.records, tree.last_plan_md, tree)


def load_repo(root: Path) -> Inputs:
    """models/**, profiles/** and gpus.yaml (optional), parsed and combined; a model under right-sizing policy
    Auto carries the effective budget its record under decisions/rightsizing/ holds."""
    return read_repo(root).inputs


def read_tree(root: Path) -> TreeInputs:
    """Every input file of a GitOps tree, parsed, plus the measured profiles committed under
    profiles/measured/ as text (cluster mode keeps or replaces them)."""
    root = Path(root)
    models, model_errors = read_models(root)
    profiles, profile_errors = read_profiles(root)
    slots, slot_errors = read_inventory(root)
    measured = root / MEASURED_PROFILES_DIR
    committed = {p.relative_to(root).as_posix(): p.read_text(encoding="utf-8")
                 for p in sorted(measured.rglob("*")) if p.is_file()} if measured.is_dir() else {}
    rightsizing = read_records(root)
    return TreeInputs(effective_models(models, rightsizing), tuple(model_errors), tuple(profiles),
                      tuple(profile_errors), tuple(slots), tuple(slot_errors), load_decision_records(root),
                      read_plan_md(root), committed, rightsizing, read_prices(root), read_rendered_workers(root))


def read_rendered_workers(root: Path) -> dict[str, str]:
    """The last rendered Deployments and ConfigMaps (path -> text): which workers a pass restarts."""
    base = Path(root) / RENDERED_DIR
    if not base.is_dir():
        return {}
    return {p.relative_to(root).as_posix(): p.read_text(encoding="utf-8")
            for p in sorted(base.glob("*/*.yaml")) if p.is_file() and not p.is_symlink()
            and p.name.startswith(("deployment-", "configmap-"))}


def read_plan_md(root: Path) -> str | None:
    path = Path(root) / PLAN_MD
    return path.read_text(encoding="utf-8") if path.is_file() else None


def _yaml_files(root: Path, sub: str) -> list[Path]:
    base = root / sub
    return sorted((p for p in base.rglob("*") if p.suffix in YAML_SUFFIXES and p.is_file()),
                  key=lambda p: p.relative_to(root).as_posix()) if base.is_dir() else []


def _read(root: Path, path: Path) -> tuple[str, Documents, list[InputError]]:
    rel = path.relative_to(root).as_posix()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return rel, [], [InputError(rel, None, "", reason="UnreadableFile", message=f"cannot read the file: {exc}",
                                    fix="save it as UTF-8 text and check its permissions")]
    return rel, *load_documents(text, rel)


def read_models(root: Path) -> tuple[list[ElasticModel], list[InputError]]:
    """Every ElasticModel under models/**, not yet checked for duplicates (`combine` does)."""
    return _parse_tree(Path(root), MODELS_DIR, lambda doc, rel, i: parse_model(doc, Source(rel, i)))


def read_profiles(root: Path) -> tuple[list[Profile], list[InputError]]:
    """Every profile under profiles/**, not yet checked for duplicates (`combine` does). Cluster mode adds
    the profiles it finds in ConfigMaps to these before combining."""
    return _parse_tree(Path(root), PROFILES_DIR, parse_profile)


def _parse_tree(root: Path, sub: str, parse: Callable) -> tuple[list, list[InputError]]:
    values, errors = [], []
    for path in _yaml_files(root, sub):
        rel, docs, errors_here = _read(root, path)
        errors += errors_here
        for index, doc in docs:
            value, errors_here = parse(doc, rel, index)
            values += [value] if value else []
            errors += errors_here
    return values, errors


def read_inventory(root: Path) -> tuple[tuple[GpuSlot, ...], list[InputError]]:
    if not (root / INVENTORY_FILE).is_file():
        return (), []
    rel, docs, errors = _read(root, root / INVENTORY_FILE)
    if not docs:
        return (), errors
    (first, doc), extra = docs[0], docs[1:]
    slots, errors_here = parse_inventory(doc, rel, first)
    return slots, errors + errors_here + [_extra_inventory(rel, index) for index, _ in extra]


def _extra_inventory(file: str, document: int) -> InputError:
    return InputError(file, document, "", reason="ExtraDocument",
                      message=f"{file} holds one GPUInventory; this further document is ignored",
                      fix="merge its nodes into the first document's nodes list")



def load_decision_records(root: Path) -> dict[tuple[str, str], DecisionRecord]:
    """decisions/<ns>/<name>.yaml as compose wrote them; unreadable or garbled files are skipped
    (the controller owns them and rewrites them on its next pass)."""
    records = {}
    for path in _yaml_files(Path(root), DECISIONS_DIR):
        try:
            doc = yaml.load(path.read_text(encoding="utf-8"), Loader=yaml.CSafeLoader)
            decision = decision_from_dict(doc["status"]["assigned"])
        except (OSError, UnicodeDecodeError, yaml.YAMLError, KeyError, TypeError, ValueError):
            continue
        spec_doc = {k: v for k, v in doc.items() if k != "status"}
        source = ((doc.get("metadata") or {}).get("annotations") or {}).get(SOURCE_ANNOTATION, "")
        model, problems = parse_model(spec_doc, Source(source or path.relative_to(root).as_posix()))
        records[decision.key] = DecisionRecord(decision, None if problems else model)
    return records
