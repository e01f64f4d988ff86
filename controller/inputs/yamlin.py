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
_KEY_TAGS = frozenset((_STR_TAG, _MERGE_TAG))  # a mapping key is a string, or `<<` (a merge key)
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

    def scaled(self, factor: int) -> YamlLimits:
        """These limits with `factor` times the nodes: for a file the controller wrote, which grows with the fleet."""
        return YamlLimits(self.max_nodes * factor, self.max_aliases, self.max_depth)


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


def _key_problem(key: yaml.Node) -> str:
    """Why a mapping key is refused: it is not a scalar, or not one read as a string (or a merge key)."""
    if not isinstance(key, yaml.ScalarNode):
        return f"a mapping key is a {'sequence' if isinstance(key, yaml.SequenceNode) else 'mapping'}"
    kind = key.tag.rsplit(":", 1)[-1]
    return f"the mapping key {_show(key.value)} is read as a YAML {kind}, not a string"


def check_node_graph(root: yaml.Node, limits: YamlLimits) -> None:
    """Raise YamlLimitExceeded if the document rooted at `root` breaks `limits` or has a key that is not a
    string. Expanded sizes and depths are memoised per node, so a bomb costs its size, not its expansion.

    One depth-first walk in document order: each node's tag (and a mapping's keys) is checked when it is
    first reached, its expanded size and depth once its children are done. A scalar is done when reached
    (size 1, depth 1), so only collections wait on the stack; every user file and decision record passes
    here, which makes this walk a visible share of reading a large fleet."""
    done: dict[int, tuple[int, int]] = {}  # id(node) -> (expanded size, depth)
    open_nodes: set[int] = set()  # collections whose children are not all done: reaching one again is recursion
    aliases = 0
    max_nodes, max_depth = limits.max_nodes, limits.max_depth
    stack: list[tuple[yaml.Node, list[yaml.Node] | None]] = [(root, None)]  # (node, its children once opened)
    while stack:
        node, children = stack.pop()
        key = id(node)
        if children is not None:  # every child is done
            size, deepest = 1, 0
            for child in children:
                child_size, child_depth = done[id(child)]
                size += child_size
                deepest = child_depth if child_depth > deepest else deepest
            done[key] = (size, deepest + 1)
            open_nodes.discard(key)
            _check_expanded(node, size, deepest + 1, limits)
            continue
        if key in done:  # a node reached again: an alias
            aliases += 1
            if aliases > limits.max_aliases:
                raise _refuse(node, f"the document has more than {limits.max_aliases} alias references",
                              "GPUSHARE_YAML_MAX_ALIASES")
            continue
        if key in open_nodes:
            raise _refuse(node, "an alias refers to a node that contains it (a recursive structure)", None)
        shape = node.id  # "scalar", "sequence" or "mapping"
        if node.tag not in _ALLOWED_TAGS[shape]:
            raise YamlLimitExceeded(None, None, f"the tag {_show(node.tag)} is not allowed on a {shape}; use plain "
                                    "YAML (strings, numbers, booleans, lists and mappings)", node.start_mark)
        if shape == "scalar":
            done[key] = (1, 1)
            if max_nodes < 1 or max_depth < 1:
                _check_expanded(node, 1, 1, limits)
            continue
        if shape == "mapping":
            children = []
            for key_node, value_node in node.value:
                if key_node.id != "scalar" or key_node.tag not in _KEY_TAGS:
                    raise YamlLimitExceeded("while reading a mapping", node.start_mark,
                                            f"{_key_problem(key_node)}; every key must be a plain string (quote it)",
                                            key_node.start_mark)
                children += (key_node, value_node)
        else:
            children = node.value
        open_nodes.add(key)
        stack.append((node, children))
        stack.extend((child, None) for child in reversed(children))


def _check_expanded(node: yaml.Node, size: int, depth: int, limits: YamlLimits) -> None:
    if size > limits.max_nodes:
        raise _refuse(node, f"the document expands to more than {limits.max_nodes} nodes (through aliases)",
                      "GPUSHARE_YAML_MAX_NODES")
    if depth > limits.max_depth:
        raise _refuse(node, f"the document nests more than {limits.max_depth} levels deep",
                      "GPUSHARE_YAML_MAX_DEPTH")


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
