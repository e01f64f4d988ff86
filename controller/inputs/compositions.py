"""Compositions: which templates compose an ElasticModel, and with which parameters.

Owns reading `compositions/*.yaml` beside the templates (the shipped ones), parsing a
repository's composition documents (`parse_composition`; controller.inputs.reader reads
the files), validating each against schemas/composition.schema.json, filling unset
parameters from the schema's defaults, and reading the template sources once (they are
compiled, sandboxed, where they render: controller.rendering.render.compiled). A repository composition adds a name or replaces the shipped composition of
the same name; it names shipped templates only, so the repository configures (image,
model cache, worker namespace, scheduling parameters) but never injects template code.
Called by controller.inputs.reader, controller.rendering.compose and `gpushare validate`.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType

import yaml

import schemas
from controller.inputs.load import kind_error, schema_errors
from controller.types import InputError
from templates import TEMPLATE_DIR


class CompositionInvalid(Exception):
    """A composition file that cannot be used; the message names the file, the field and the fix."""

    reason = "CompositionInvalid"


class Templates:
    """The template sources a composition renders from (name -> text); one value per template directory,
    hashed by identity, so the sandbox that compiles them is built once per directory."""

    def __init__(self, sources: Mapping[str, str]):
        self.sources = MappingProxyType(dict(sources))


@dataclass(frozen=True)
class Composition:
    name: str
    parameters: Mapping[str, object]
    profiling: tuple[str, ...]
    per_worker: tuple[str, ...]
    per_model: tuple[str, ...]
    templates: Templates = field(compare=False, repr=False)
    source: str | None = field(default=None, compare=False)  # the repository file; None when shipped
    explicit: frozenset[str] = frozenset()  # the parameters its file sets (the rest took the defaults)


@lru_cache(maxsize=1)
def shipped_compositions() -> Mapping[str, Composition]:
    """The compositions this package ships, read and compiled once per process (templates are code)."""
    return MappingProxyType(load_compositions())


def load_compositions(root: Path = TEMPLATE_DIR) -> dict[str, Composition]:
    """Every composition under `root/compositions/`, its templates read from `root/*.j2`."""
    sources = {path.name: path.read_text(encoding="utf-8") for path in sorted(root.glob("*.j2"))}
    templates = Templates(sources)
    found: dict[str, Composition] = {}
    for path in sorted((root / "compositions").glob("*.yaml")):
        composition = _parse(path, templates)
        if composition.name in found:
            raise CompositionInvalid(
                f"{path}: a second composition named {composition.name!r}; give each file a unique metadata.name"
            )
        found[composition.name] = composition
    return found


def _parse(path: Path, templates: Templates) -> Composition:
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise CompositionInvalid(f"{path}: not YAML ({exc}); fix the syntax") from exc
    problems = sorted(schemas.validator("composition").iter_errors(doc), key=lambda e: list(e.absolute_path))
    if problems:
        first = problems[0]
        where = "/".join(str(p) for p in first.absolute_path) or "(root)"
        raise CompositionInvalid(
            f"{path}: {where}: {first.message}; see schemas/composition.schema.json for the allowed fields"
        )
    steps = doc["spec"]["steps"]
    lists = (steps["profiling"]["perModel"], steps["serving"]["perWorker"], steps["serving"]["perModel"])
    missing = sorted({name for names in lists for name in names} - set(templates.sources))
    if missing:
        raise CompositionInvalid(
            f"{path}: templates {missing} do not exist beside it; add them to {path.parent.parent} or fix the names"
        )
    return Composition(
        name=doc["metadata"]["name"],
        parameters=MappingProxyType(_with_defaults(doc["spec"].get("parameters", {}))),
        profiling=tuple(lists[0]),
        per_worker=tuple(lists[1]),
        per_model=tuple(lists[2]),
        templates=templates,
        explicit=frozenset(doc["spec"].get("parameters", {})),
    )


def _shipped_templates() -> Templates:
    return next(iter(shipped_compositions().values())).templates


def shipped_templates() -> frozenset[str]:
    """The template files a composition may name."""
    return frozenset(path.name for path in TEMPLATE_DIR.glob("*.j2"))


def parse_composition(doc: object, file: str, document: int | None = 0) -> tuple[Composition | None, list[InputError]]:
    """A repository composition from one document, or the errors that prevent it (one per JSON path)."""
    wrong = kind_error(doc, "Composition", file, document)
    if wrong:
        return None, [wrong]
    errors = schema_errors(doc, "composition", file, document, None)
    if errors:
        return None, errors
    steps = doc["spec"]["steps"]
    lists = {"spec.steps.profiling.perModel": steps["profiling"]["perModel"],
             "spec.steps.serving.perWorker": steps["serving"]["perWorker"],
             "spec.steps.serving.perModel": steps["serving"]["perModel"]}
    available = shipped_templates()
    for path, names in lists.items():
        for index, name in enumerate(names):
            if name not in available:
                errors.append(InputError(file, document, f"{path}[{index}]", reason="UnknownTemplate",
                                         message=f"{path}[{index}] names template {name!r}, which gpushare does "
                                                 "not ship",
                                         fix=f"use one of: {', '.join(sorted(available))}"))
    if errors:
        return None, errors
    return Composition(
        name=doc["metadata"]["name"],
        parameters=MappingProxyType(_with_defaults(doc["spec"].get("parameters", {}))),
        profiling=tuple(lists["spec.steps.profiling.perModel"]),
        per_worker=tuple(lists["spec.steps.serving.perWorker"]),
        per_model=tuple(lists["spec.steps.serving.perModel"]),
        templates=_shipped_templates(),
        source=file,
        explicit=frozenset(doc["spec"].get("parameters", {})),
    ), []


def _with_defaults(given: Mapping[str, object]) -> dict[str, object]:
    declared = schemas.load("composition")["$defs"]["parameters"]["properties"]
    return {name: given.get(name, spec["default"]) for name, spec in sorted(declared.items())}
