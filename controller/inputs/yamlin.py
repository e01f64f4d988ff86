"""Reading YAML documents fast: libyaml composes the nodes, plain Python builds the values.

Owns `parse_documents`, which returns what `yaml.load_all(text, Loader=yaml.CSafeLoader)`
returns for the documents gpushare reads in bulk (rendered template output, ElasticModel
files), without PyYAML's generic constructor machinery: mappings, sequences and string
scalars are built directly; every other scalar (ints, bools, floats, timestamps, binary)
goes to PyYAML's own safe constructor, and so do merge keys and non-scalar keys. Called by
controller.rendering.render (template output) and controller.inputs.load (user files, with
`unique_keys=True`: a key repeated in one mapping is an error, not a silent override).

User documents are read with `limits` (`YamlLimits`): before a document is built its node
graph is checked, in time linear in the graph, for alias expansion (a few hundred bytes of
nested anchors that would expand to billions of nodes), nesting depth, recursive aliases,
mapping keys that are not strings and tags beyond YAML's core types. Any of these raises `YamlLimitExceeded` (a
`yaml.MarkedYAMLError`, with the line) before any memory is spent on expansion.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import yaml

_STR_TAG = "tag:yaml.org,2002:str"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_YAML = "tag:yaml.org,2002:"
# The tags a user document may carry, explicitly or implicitly: YAML's core types; no language-specific
# tags (`!!python/...`) and no custom ones (`!secret`), which the fast builder would otherwise ignore.
_ALLOWED_TAGS = {
    "scalar": {_YAML + t for t in ("str", "int", "float", "bool", "null", "timestamp", "binary", "merge")},
    "sequence": {_YAML + "seq"},
    "mapping": {_YAML + "map"},
}
_SHOWN_CHARS = 40


@dataclass(frozen=True)
class YamlLimits:
    """Bounds on one user document (see docs/limits.md); each has an environment setting."""

    max_nodes: int = 200_000  # nodes once every alias is expanded
    max_aliases: int = 10_000  # alias references (`*name`)
    max_depth: int = 64  # nesting of mappings and sequences

    @classmethod
    def from_env(cls, environ=os.environ) -> YamlLimits:
        """GPUSHARE_YAML_MAX_NODES, GPUSHARE_YAML_MAX_ALIASES, GPUSHARE_YAML_MAX_DEPTH override the defaults."""
        def setting(name: str, default: int) -> int:
            text = environ.get(name, "").strip()
            return int(text) if text.isdigit() and int(text) > 0 else default

        return cls(setting("GPUSHARE_YAML_MAX_NODES", cls.max_nodes),
                   setting("GPUSHARE_YAML_MAX_ALIASES", cls.max_aliases),
                   setting("GPUSHARE_YAML_MAX_DEPTH", cls.max_depth))


class YamlLimitExceeded(yaml.MarkedYAMLError):
    """A document refused before it is built: too large once expanded, too deep, or an odd key."""


def parse_documents(text: str, *, unique_keys: bool = False, limits: YamlLimits | None = None) -> list[object]:
    """Every document of `text` (None for an empty one). Raises yaml.YAMLError on bad YAML or, with
    `unique_keys`, a repeated key; with `limits`, YamlLimitExceeded on a document beyond them (checked
    before it is built); RecursionError on a self-referencing alias when no limits are given."""
    loader = yaml.CSafeLoader(text)
    try:
        documents = []
        while loader.check_node():
            node = loader.get_node()
            if limits is not None and node is not None:
                check_node_graph(node, limits)
            documents.append(_build(node, loader, unique_keys))
        return documents
    finally:
        loader.dispose()


def _show(text: str) -> str:
    return repr(text) if len(text) <= _SHOWN_CHARS else f"{text[:_SHOWN_CHARS]!r}… ({len(text)} characters)"


def _key_problem(key: yaml.Node) -> str | None:
    if not isinstance(key, yaml.ScalarNode):
        return f"a mapping key is a {'sequence' if isinstance(key, yaml.SequenceNode) else 'mapping'}"
    if key.tag in (_STR_TAG, _MERGE_TAG):
        return None
    kind = key.tag.rsplit(":", 1)[-1]
    return f"the mapping key {_show(key.value)} is read as a YAML {kind}, not a string"


def check_node_graph(root: yaml.Node, limits: YamlLimits) -> None:
    """Raise YamlLimitExceeded if the document rooted at `root` breaks `limits` or has a key that is not a
    string. Expanded sizes and depths are memoised per node, so a bomb costs its size, not its expansion."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    aliases = 0
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    open_nodes: set[int] = set()
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            children = _children(node)
            size[key] = 1 + sum(size[id(c)] for c in children)
            depth[key] = 1 + max((depth[id(c)] for c in children), default=0)
            open_nodes.discard(key)
            if size[key] > limits.max_nodes:
                raise _refuse(node, f"the document expands to more than {limits.max_nodes} nodes (through aliases)",
                              "GPUSHARE_YAML_MAX_NODES")
            if depth[key] > limits.max_depth:
                raise _refuse(node, f"the document nests more than {limits.max_depth} levels deep",
                              "GPUSHARE_YAML_MAX_DEPTH")
            continue
        if key in size:  # a node reached again: an alias
            aliases += 1
            if aliases > limits.max_aliases:
                raise _refuse(node, f"the document has more than {limits.max_aliases} alias references",
                              "GPUSHARE_YAML_MAX_ALIASES")
            continue
        if key in open_nodes:
            raise _refuse(node, "an alias refers to a node that contains it (a recursive structure)", None)
        shape = "scalar" if isinstance(node, yaml.ScalarNode) else (
            "sequence" if isinstance(node, yaml.SequenceNode) else "mapping")
        if node.tag not in _ALLOWED_TAGS[shape]:
            raise YamlLimitExceeded(None, None, f"the tag {_show(node.tag)} is not allowed on a {shape}; use plain "
                                    "YAML (strings, numbers, booleans, lists and mappings)", node.start_mark)
        if isinstance(node, yaml.MappingNode):
            for key_node, _ in node.value:
                problem = _key_problem(key_node)
                if problem:
                    raise YamlLimitExceeded("while reading a mapping", node.start_mark,
                                            f"{problem}; every key must be a plain string (quote it)",
                                            key_node.start_mark)
        open_nodes.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in reversed(_children(node)))


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _refuse(node: yaml.Node, problem: str, setting: str | None) -> YamlLimitExceeded:
    how = f" (the limit is set by {setting})" if setting else ""
    return YamlLimitExceeded(None, None, f"{problem}{how}; the document is not read", node.start_mark)


def _build(node: yaml.Node, loader: yaml.CSafeLoader, unique_keys: bool) -> object:
    if isinstance(node, yaml.ScalarNode):
        return node.value if node.tag == _STR_TAG else loader.construct_object(node, deep=True)
    if isinstance(node, yaml.SequenceNode):
        return [_build(item, loader, unique_keys) for item in node.value]
    if any(not isinstance(key, yaml.ScalarNode) or key.tag == _MERGE_TAG for key, _ in node.value):
        return loader.construct_object(node, deep=True)
    mapping = {_build(key, loader, unique_keys): _build(value, loader, unique_keys) for key, value in node.value}
    if unique_keys and len(mapping) != len(node.value):
        seen: set = set()
        for key_node, _ in node.value:
            key = _build(key_node, loader, unique_keys)
            if key in seen:
                raise yaml.constructor.ConstructorError("while constructing a mapping", node.start_mark,
                                                        f"found duplicate key {_show(str(key))}", key_node.start_mark)
            seen.add(key)
    return mapping
