"""Hostile JSON schemas for response_format and tools: built by depth, width and `$ref` shape.

`chain(n, link)` is n definitions, each referring to the next through `link` (issue 34's crash: 1,000 of
them in a few levels of JSON); `schemas()` is the hypothesis strategy over every shape: chains, cycles
(the last definition refers back to the first), mutual recursion (each refers to two others), shared
trees (each uses the next `fan` times: expands exponentially), wide anyOf/allOf/properties, and plain JSON
nesting, each at depths from harmless to far past the worker's bounds. Imported by
tests/test_worker_schema_bounds.py (units), tests/test_worker_hostile_schemas.py (a `python -m worker`
process) and tests/test_fuzz_worker_api.py (schemathesis bodies carrying them).
"""
from __future__ import annotations

from hypothesis import strategies as st

# One way each for a subschema to refer to another (`ref` is the JSON pointer to it).
LINKS = {
    "ref": lambda ref: {"$ref": ref},
    "property": lambda ref: {"type": "object", "properties": {"next": {"$ref": ref}}, "required": ["next"]},
    "optional": lambda ref: {"type": "object", "properties": {"next": {"$ref": ref}}},
    "items": lambda ref: {"type": "array", "items": {"$ref": ref}, "maxItems": 2},
    "prefix": lambda ref: {"type": "array", "prefixItems": [{"$ref": ref}]},
    "additional": lambda ref: {"type": "object", "additionalProperties": {"$ref": ref}},
    "anyof": lambda ref: {"anyOf": [{"$ref": ref}, {"type": "null"}]},
    "allof": lambda ref: {"allOf": [{"type": "object", "properties": {"next": {"$ref": ref}}},
                                    {"type": "object", "properties": {"n": {"type": "integer"}}}]},
}
LEAF = {"type": "string", "maxLength": 4}


def _ref(i: int) -> str:
    return f"#/$defs/d{i}"


def chain(n: int, link: str = "property") -> dict:
    """n definitions, each referring to the next through `link`; the last is a short string."""
    definitions = {f"d{i}": LINKS[link](_ref(i + 1)) for i in range(n)}
    definitions[f"d{n}"] = LEAF
    return {"$defs": definitions, "$ref": _ref(0)}


def cycle(n: int, link: str = "anyof") -> dict:
    """n definitions in a ring: the last refers back to the first (recursion through n definitions)."""
    definitions = {f"d{i}": LINKS[link](_ref((i + 1) % n)) for i in range(n)}
    return {"$defs": definitions, "$ref": _ref(0)}


def mutual(n: int) -> dict:
    """n definitions, each optionally holding two others: one strongly connected recursion."""
    definitions = {f"d{i}": {"type": "object", "properties": {"a": {"$ref": _ref((i + 1) % n)},
                                                                "b": {"$ref": _ref((i * 7 + 3) % n)}}}
                   for i in range(n)}
    return {"$defs": definitions, "$ref": _ref(0)}


def shared(n: int, fan: int) -> dict:
    """n definitions, each using the next `fan` times: fan ** n subschemas once expanded."""
    definitions = {f"d{i}": {"type": "object", "properties": {f"p{j}": {"$ref": _ref(i + 1)} for j in range(fan)}}
                   for i in range(n)}
    definitions[f"d{n}"] = LEAF
    return {"$defs": definitions, "$ref": _ref(0)}


def wide(keyword: str, width: int) -> dict:
    """One anyOf/oneOf/allOf/prefixItems list or properties map of `width` entries."""
    if keyword == "properties":
        return {"type": "object", "properties": {f"k{i}": {"type": "integer"} for i in range(width)}}
    if keyword == "prefixItems":
        return {"type": "array", "prefixItems": [{"type": "integer"} for _ in range(width)]}
    entries = [{"type": "object", "properties": {f"k{i}": {"type": "integer"}}, "required": [f"k{i}"]}
               for i in range(width)]
    return {keyword: entries}


def nested(levels: int) -> dict:
    """Plain JSON nesting, no $ref: arrays of objects `levels` deep (each level is 4 levels of JSON)."""
    schema: dict = LEAF
    for _ in range(levels):
        schema = {"type": "array", "items": {"type": "object", "properties": {"v": schema}}, "maxItems": 1}
    return schema


_SIZES = st.one_of(st.integers(1, 40), st.integers(100, 300), st.integers(900, 3000))


def schemas() -> st.SearchStrategy[dict]:
    """Every shape above, at depths from harmless to far past the bounds (at most a few hundred KB of JSON)."""
    links = st.sampled_from(sorted(LINKS))
    return st.one_of(
        st.builds(chain, _SIZES, links),
        st.builds(cycle, _SIZES, links),
        st.builds(mutual, _SIZES),
        st.builds(shared, st.integers(1, 30), st.integers(1, 4)),
        st.builds(wide, st.sampled_from(["anyOf", "oneOf", "allOf", "prefixItems", "properties"]),
                  st.one_of(st.integers(1, 50), st.integers(1000, 1100))),
        st.builds(nested, st.integers(1, 15)),
    )
