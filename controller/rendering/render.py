"""Safe Jinja rendering of Kubernetes manifests.

Owns the sandboxed Jinja environment every composition template runs in, with the
one way a value reaches YAML: the `quote` filter (controller.rendering.quote), which
emits a double-quoted YAML scalar. A `finalize` hook refuses any other string output, so a template that
forgets to quote a value fails to render instead of letting a field add keys or
documents. Called by controller.rendering.compose.
"""
from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from types import MappingProxyType

import yaml
from jinja2 import BaseLoader, DictLoader, StrictUndefined, TemplateError
from jinja2.sandbox import SandboxedEnvironment

from contract import wire
from controller.inputs.compositions import Templates
from controller.rendering.quote import Quoted, yaml_quote
from controller.rendering.shapes import read_output


class UnquotedOutput(TemplateError):
    """A template printed a string without `| quote`."""


class RenderError(Exception):
    """A template failed to render or its output is not YAML; `detail` says where."""

    def __init__(self, template: str, detail: str):
        super().__init__(f"{template}: {detail}")
        self.template = template
        self.detail = detail


def _finalize(value: object) -> object:
    if isinstance(value, Quoted) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise UnquotedOutput(
        f"a template printed {type(value).__name__} {str(value)[:60]!r} without `| quote`; "
        "every printed value must be an integer or pass through `| quote`"
    )


WIRE = MappingProxyType({name: value for name, value in vars(wire).items() if name.isupper() and isinstance(value, str)})

_MAPPING_ATTRIBUTES = {kind: frozenset(dir(kind)) for kind in (dict, MappingProxyType)}


class _Sandbox(SandboxedEnvironment):
    """Jinja's sandbox, which reads `worker.name` of a plain mapping as its item at once: the sandbox would first
    try the attribute, which a dict or mappingproxy has only for the names of its methods, and fail (an exception
    per lookup). Method names (`params.items()`) go the sandbox's way."""

    def getattr(self, obj: object, attribute: str) -> object:
        names = _MAPPING_ATTRIBUTES.get(type(obj))
        if names is not None and attribute not in names:
            try:
                return obj[attribute]  # type: ignore[index]
            except (KeyError, TypeError):
                pass
        return super().getattr(obj, attribute)


def environment(loader: BaseLoader) -> SandboxedEnvironment:
    """The sandbox templates run in: no undefined names, no autoescape, only quoted strings out."""
    env = _Sandbox(
        loader=loader,
        undefined=StrictUndefined,
        autoescape=False,
        finalize=_finalize,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["quote"] = yaml_quote
    env.globals["wire"] = WIRE  # label and annotation names: `{{ wire.WORKER_LABEL | quote }}: ...`
    return env


@lru_cache(maxsize=None)
def compiled(templates: Templates) -> SandboxedEnvironment:
    """The sandbox over one template directory's sources, built once (Jinja caches each compiled template)."""
    return environment(DictLoader(dict(templates.sources)))


def render_documents(env: SandboxedEnvironment, template: str, context: Mapping[str, object]
                     ) -> list[tuple[dict, str | None]]:
    """Render one template and read it as libyaml's safe loader does (controller.rendering.shapes): the objects it
    defines, in order, each with its canonical text (controller.rendering.yamlout.dump) where its shape gives it,
    else None."""
    try:
        text = env.get_template(template).render(**context)
    except TemplateError as exc:
        raise RenderError(template, f"{type(exc).__name__}: {exc}") from exc
    try:
        docs = [(doc, canonical) for doc, canonical in read_output(text) if doc is not None]
    except (yaml.YAMLError, RecursionError) as exc:
        raise RenderError(template, f"output is not YAML: {exc}") from exc
    for doc, _ in docs:
        if not isinstance(doc, dict):
            raise RenderError(template, f"a document is a {type(doc).__name__}, not a mapping")
    return docs
