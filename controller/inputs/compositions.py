"""Compositions: which templates compose an ElasticModel, and with which parameters.

Owns reading `compositions/*.yaml` beside the templates (the shipped ones), parsing a
repository's composition documents (`parse_composition`; controller.inputs.reader reads
the files), validating each against schemas/composition.schema.json, filling unset
parameters from the schema's defaults, checking each parameter against the Kubernetes rule of the
field it fills (`parameter_problems`, controller.inputs.kube_rules), and reading the template sources
once (they are compiled, sandboxed, where they render: controller.rendering.render.compiled). A
repository composition adds a name or replaces the shipped composition of
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
from controller.inputs import kube_rules
from controller.inputs.cache_policy import REASON as HOST_PATH_REASON
from controller.inputs.cache_policy import host_path_problem, host_path_root
from controller.inputs.kube_rules import Problem
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
    problems = parameter_problems(doc["spec"].get("parameters", {}))
    if problems:
        raise CompositionInvalid(f"{path}: {problems[0].where}: {_said(problems[0])} ({problems[0].reason})")
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
    errors = [InputError(file, document, f"spec.{p.where}", reason=p.reason, message=f"spec.{p.where}: {_said(p)}",
                         fix=PARAMETER_FIX[p.reason]) for p in parameter_problems(doc["spec"].get("parameters", {}))]
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
    errors += _authorization_problems(doc["spec"].get("parameters", {}), file, document)
    outside = host_path_problem(doc["spec"].get("parameters", {}), host_path_root())
    if outside:
        errors.append(InputError(file, document, "spec.parameters.modelCache.hostPath", reason=HOST_PATH_REASON,
                                 message=outside[0], fix=outside[1]))
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


def _authorization_problems(parameters: Mapping[str, object], file: str, document: int | None) -> list[InputError]:
    """API keys with `authorization: none`: keys the worker would never check (it refuses such a start too,
    worker.auth_checks), so the composition is refused rather than rendered into an open API."""
    authorization = _with_defaults(parameters)["authorization"]
    if not parameters.get("apiKeySecret") or authorization != "none":
        return []
    return [InputError(file, document, "spec.parameters.apiKeySecret", reason="KeysWithoutAuthorization",
                       message="spec.parameters.apiKeySecret is set with authorization: none, which checks no key: "
                               "the workers would serve every model to whoever reaches them",
                       fix="set authorization: kubernetes to check the keys (and ServiceAccount tokens), or remove "
                           "apiKeySecret to serve open on purpose")]


def _with_defaults(given: Mapping[str, object]) -> dict[str, object]:
    declared = schemas.load("composition")["$defs"]["parameters"]["properties"]
    return {name: given.get(name, spec["default"]) for name, spec in sorted(declared.items())}


def _scalar(rule, reason: str):
    """A parameter that fills one field of that rule: its problems as Problems at `parameters.NAME`."""
    return lambda value, at: [Problem(reason, at, value, m) for m in rule(str(value))]


# Each parameter checked against the rule of the Kubernetes field it fills (the JSON schema checks types).
PARAMETER_RULES = {
    "workerCpu": _scalar(kube_rules.quantity, "InvalidQuantity"),  # resources.requests.cpu of the worker
    "profilerCpu": _scalar(kube_rules.quantity, "InvalidQuantity"),  # resources.requests.cpu of the profiler
    "profilerMemory": _scalar(kube_rules.quantity, "InvalidQuantity"),  # resources.requests.memory of the profiler
    "kaiQueue": _scalar(kube_rules.label_value, "InvalidLabel"),  # the kai.scheduler/queue label
    "image": _scalar(kube_rules.container_image, "InvalidImage"),  # containers[].image
    "nodeSelector": kube_rules.labels,  # spec.nodeSelector
    "tolerations": kube_rules.tolerations,  # spec.tolerations
}
PARAMETER_FIX = {
    "InvalidQuantity": "write a Kubernetes quantity: " + kube_rules.QUANTITY_HINT,
    "InvalidLabel": "write label keys as " + kube_rules.KEY_HINT + ", and label values as " + kube_rules.LABEL_HINT,
    "InvalidImage": "write an image reference without surrounding whitespace (e.g. registry/worker:0.1.0)",
    "InvalidToleration": "write a toleration as Kubernetes accepts it: a key in the form of a label key (or none "
                         "with operator Exists), a label value (none with Exists), effect NoExecute when "
                         "tolerationSeconds is set",
}


def parameter_problems(parameters: Mapping[str, object]) -> list[Problem]:
    """What the Kubernetes fields these composition parameters fill would refuse, at `parameters.NAME...`."""
    return [problem for name, check in PARAMETER_RULES.items() if name in parameters
            for problem in check(parameters[name], f"parameters.{name}")]


def _said(problem: Problem) -> str:
    return f"{problem.value!r} {problem.message}"
