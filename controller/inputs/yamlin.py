"""Reading YAML documents fast: libyaml parses, plain Python builds the values.

Owns `parse_documents`, which returns what `yaml.load_all(text, Loader=yaml.CSafeLoader)`
returns for the documents gpushare reads in bulk (rendered template output, ElasticModel
files, decision records), without PyYAML's generic composer and constructor machinery. Three
ways, one result:

- the canonical path (controller.inputs.canonical), taken first: a text in the exact layout
  gpushare's own YAML writer produces (decision records, rendered files) is read line by line
  with no parser at all. At the first line that strays from that layout (a comment, `---`, a
  flow collection, a quote style, an indentation or a key order the writer never produces) or
  near `limits`, it answers None, and the text is read by
- the event path (`_from_events`): values are built straight from libyaml's
  parse events, with no node graph; each plain scalar's type is resolved once per distinct
  text and every non-string scalar (ints, bools, floats, timestamps, binary) is built by
  PyYAML's own safe constructor. It handles the YAML gpushare writes and users write: block
  and flow collections, every scalar style. At the first thing it does not handle alone (an
  anchor or alias, an explicit tag, a merge key, a key that is not a string, a repeated key
  under `unique_keys`, a document beyond `limits`) or any error, it stops and
  the text is read again by
- the node path: libyaml composes the nodes, `check_node_graph` checks them against `limits`,
  `_build` builds mappings, sequences and strings and hands everything else (merge keys,
  non-scalar keys) to PyYAML's constructor. Its answer, value or error, is the reference.

Called by controller.rendering.render (template output) and controller.inputs.load (user files, with
`unique_keys=True`: a key repeated in one mapping is an error, not a silent override).

User documents are read with `limits` (`YamlLimits`, controller.inputs.yaml_limits): before a document is built its node
graph is checked, in time linear in the graph, for alias expansion (a few hundred bytes of
nested anchors that would expand to billions of nodes), nesting depth, recursive aliases,
mapping keys that are not strings and tags beyond YAML's core types. Any of these raises `YamlLimitExceeded` (a
`yaml.MarkedYAMLError`, with the line) before any memory is spent on expansion.
"""
from __future__ import annotations

import yaml

from controller.inputs.canonical import from_canonical
from controller.inputs.yaml_limits import YamlLimits

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


class YamlLimitExceeded(yaml.MarkedYAMLError):
    """A document refused before it is built: too large once expanded, too deep, or an odd key."""


def parse_documents(text: str, *, unique_keys: bool = False, limits: YamlLimits | None = None) -> list[object]:
    """Every document of `text` (None for an empty one). Raises yaml.YAMLError on bad YAML or, with
    `unique_keys`, a repeated key; with `limits`, YamlLimitExceeded on a document beyond them (checked
    before it is built); RecursionError on a self-referencing alias when no limits are given."""
    documents = from_canonical(text, limits)
    if documents is not None:
        return documents
    try:
        documents = _from_events(text, unique_keys, limits)
    except Exception:  # noqa: BLE001 - any problem: the node path gives the reference answer (or error)
        documents = None
    return documents if documents is not None else _from_nodes(text, unique_keys, limits)


def _from_nodes(text: str, unique_keys: bool, limits: YamlLimits | None) -> list[object]:
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


_RESOLVED: dict[str, object] = {}  # a plain scalar's text -> its value: texts recur across documents
_RESOLVED_MAX = 100_000
_EVENTS = yaml.events


def _scalar(loader: yaml.CSafeLoader, event: yaml.ScalarEvent) -> object:
    """A scalar's value as PyYAML builds it: resolved by the text's implicit type, then constructed. A type PyYAML
    cannot construct alone (a merge key `<<`, `=`) raises: the node path answers."""
    if not event.implicit[0]:  # quoted or block scalars without a tag are strings
        return event.value
    key = event.value
    value = _RESOLVED.get(key, _RESOLVED)
    if value is _RESOLVED:
        tag = loader.resolve(yaml.ScalarNode, event.value, (True, False))
        value = event.value if tag == _STR_TAG else \
            loader.construct_object(yaml.ScalarNode(tag, event.value, style=event.style), deep=True)
        if len(_RESOLVED) < _RESOLVED_MAX:
            _RESOLVED[key] = value
    return value


def _from_events(text: str, unique_keys: bool, limits: YamlLimits | None) -> list[object] | None:
    """`parse_documents` built from parse events alone; None where only the node path can answer."""
    loader = yaml.CSafeLoader(text)
    get = loader.get_event
    scalar_event, mapping_start, sequence_start = _EVENTS.ScalarEvent, _EVENTS.MappingStartEvent, \
        _EVENTS.SequenceStartEvent
    collection_end = (_EVENTS.MappingEndEvent, _EVENTS.SequenceEndEvent)
    max_nodes = limits.max_nodes if limits is not None else -1
    max_depth = limits.max_depth if limits is not None else _UNLIMITED_DEPTH
    try:
        get()  # StreamStartEvent
        documents: list[object] = []
        while type(get()) is _EVENTS.DocumentStartEvent:
            # stack entries: [container, pending key or _NO_KEY, is-mapping]
            stack: list[list] = []
            root: object = None
            nodes = 0
            while True:
                event = get()
                kind = type(event)
                if kind is scalar_event:
                    if event.anchor is not None or event.tag is not None or len(stack) == max_depth:
                        return None  # (a scalar inside max_depth collections makes the document one deeper)
                    value = _scalar(loader, event)
                    nodes += 1
                elif kind is mapping_start or kind is sequence_start:
                    if event.anchor is not None or event.tag is not None:
                        return None
                    nodes += 1
                    stack.append([{} if kind is mapping_start else [], _NO_KEY, kind is mapping_start])
                    if len(stack) > max_depth:
                        return None
                    continue
                elif kind in collection_end:
                    value = stack.pop()[0]
                elif kind is _EVENTS.DocumentEndEvent:
                    break
                else:  # an alias
                    return None
                if max_nodes >= 0 and nodes > max_nodes:
                    return None
                if not stack:
                    root = value
                    continue
                top = stack[-1]
                if not top[2]:
                    top[0].append(value)
                elif top[1] is _NO_KEY:
                    if type(value) is not str:
                        return None  # a key that is not a string
                    top[1] = value
                else:
                    if unique_keys and top[1] in top[0]:
                        return None
                    top[0][top[1]] = value
                    top[1] = _NO_KEY
            documents.append(root)
        return documents
    finally:
        loader.dispose()


_NO_KEY = object()
_UNLIMITED_DEPTH = 500  # deeper without limits: the node path answers (a RecursionError, as before)
