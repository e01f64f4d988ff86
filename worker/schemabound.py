"""The bounds a response_format schema or a request's tools meet before any of it reaches the grammar library.

Owns what a structured-output request may cost the native grammar compiler (llguidance), checked on the
*resolved* schema graph, not on the JSON nesting of the body: every subschema is a node, every keyword that
holds subschemas (properties, items, anyOf, ...) and every `$ref` (resolved with `referencing`, so `$id`,
`$anchor` and JSON pointers resolve as the grammar library resolves them) is an edge. On that graph:

- depth: the most subschemas on one path, each `$ref` followed (a chain of 1,000 definitions that each refer
  to the next is 1,000 levels deep, in a few levels of JSON). A cycle (recursion: a tree, mutual recursion)
  counts every subschema on it once: the grammar library turns recursion into a rule, but may walk the whole
  cycle on its stack first. The compiler's stack grows with this depth (bench/grammar_stack.py);
- expanded size: the subschemas there would be with every `$ref` replaced by its target (a definition used
  twice counts twice; a cycle once): a few definitions that each use the next twice are millions of nodes;
- width: the entries of one anyOf/oneOf/allOf/prefixItems list or one properties/patternProperties/
  dependentSchemas map (the library's cost grows faster than linearly with many optional properties);
- a `$ref` that does not resolve within the request (nothing is ever fetched);
- tools: how many, their names (the grammar and the answer's parser carry them), each one's parameters
  schema by the bounds above, and all of them together by the expanded size.

The walk is iterative (no recursion, whatever the graph), linear in the schema. Called by worker/grammar.py
(`check_schema`, `check_tools`) before it compiles, and by worker/protocol.py (`check_tool_list`) when a
request's tools are parsed.
"""
from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from referencing import Registry
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

from .errors import SchemaRefused

MAX_DEPTH = 256  # subschemas on one path, $refs followed; bench/grammar_stack.py: the stack this needs
MAX_EXPANDED = 1_000_000  # subschemas with every $ref expanded, per request
MAX_WIDTH = 1024  # entries of one anyOf/oneOf/allOf/prefixItems list or properties-like map
MAX_TOOLS = 128  # OpenAI's limit too
TOOL_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")  # OpenAI's names ([A-Za-z0-9_-], 64), and dotted ones

_ONE = ("items", "additionalItems", "additionalProperties", "contains", "not", "if", "then", "else",
        "propertyNames", "unevaluatedItems", "unevaluatedProperties", "contentSchema")
_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")  # items: a list in drafts before 2020-12
_MAPS = ("properties", "patternProperties", "dependentSchemas", "dependencies")
# $defs and definitions are no edges: a definition is compiled where a $ref uses it, and only then (the grammar
# library leaves the others alone, a 5,000-deep chain among them included)
_ONE_SCHEMA, _LIST, _MAP = 1, 2, 4  # what a keyword's value may hold (items: one schema or a list)
_KIND = {key: sum(kind for keys, kind in ((_ONE, _ONE_SCHEMA), (_LISTS, _LIST), (_MAPS, _MAP)) if key in keys)
         for key in (*_ONE, *_LISTS, *_MAPS)}
_SHOWN_STEPS = 4


@dataclass(frozen=True)
class SchemaSize:
    """A checked schema's measures: `depth` and `expanded` as the module docstring defines them."""

    depth: int
    expanded: int


def check_schema(schema: object, param: str, *, expanded_budget: int = MAX_EXPANDED) -> SchemaSize:
    """The measures of `schema` (the schema in request field `param`), or SchemaRefused naming the bound it
    passes, where, and how to fix it."""
    graph = _Graph(schema, param)
    depth, path = graph.deepest()
    if depth > MAX_DEPTH:
        raise SchemaRefused("depth", f"the JSON schema in {param} nests {depth} levels deep once its $refs are "
                            f"followed (at most {MAX_DEPTH}): {_path(path)}; flatten it (a chain of definitions "
                            "that each refer to the next, or a recursion through many definitions), so that "
                            f"no more than {MAX_DEPTH} subschemas lie on any one path", param=param)
    expanded = graph.expanded(expanded_budget)
    if expanded > expanded_budget:
        raise SchemaRefused("expanded", f"the JSON schema in {param} holds more than {expanded_budget} "
                            f"subschemas once every $ref is expanded where it is used (at most {MAX_EXPANDED} "
                            "per request); refer to fewer shared definitions from shared definitions, or send "
                            "a smaller schema", param=param)
    return SchemaSize(depth, expanded)


def check_tool_list(tools: Sequence[dict]) -> None:
    """The tools a request offers, as protocol.py parsed them: at most MAX_TOOLS, names TOOL_NAME, each once."""
    if len(tools) > MAX_TOOLS:
        raise SchemaRefused("tools", f"the request offers {len(tools)} tools, more than {MAX_TOOLS}; offer the "
                            "ones this turn may call", param="tools")
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        name = tool["function"]["name"]
        if TOOL_NAME.fullmatch(name) is None:
            raise SchemaRefused("tools", f"tools[{i}].function.name {name[:80]!r} is not 1 to 64 of the letters, "
                                "digits, '_', '-', '.' and ':'; rename the function", param=f"tools[{i}]")
        if name in seen:
            raise SchemaRefused("tools", f"tools[{i}].function.name {name!r} names a function offered before; "
                                "each function is offered once", param=f"tools[{i}]")
        seen.add(name)


def check_tools(schemas: Sequence[dict]) -> None:
    """Each tool's parameters schema by the bounds of `check_schema`, all of them within one expanded budget."""
    budget = MAX_EXPANDED
    for i, schema in enumerate(schemas):
        budget -= check_schema(schema, f"tools[{i}].function.parameters", expanded_budget=budget).expanded


class _Graph:
    """The subschemas reachable from a root, numbered in the order found, with their edges (containment and
    resolved $refs), and where each was found (a JSON pointer, or the $ref that reached it first)."""

    def __init__(self, root: object, param: str):
        self.param = param
        self._places: list[tuple] = []  # (parent, key[, name]) or (ref text,): where each node was found
        self.edges: list[list[int]] = []
        self._index: dict[int, int] = {}
        self._keep: list[object] = []  # the subschemas, alive while their id() numbers them
        self._named = _names_resources(root)
        try:
            self._specification = DRAFT202012.detect(root)  # its $schema's draft, else 2020-12
            resource = self._specification.create_resource(root)
            registry = Registry().with_resource(resource.id() or "", resource)
            if self._named:
                registry = registry.crawl()  # $id and $anchor: the registry must know every embedded resource
            resolver = registry.resolver(base_uri=resource.id() or "")
        except Exception as exc:  # noqa: BLE001 - a $schema, $id or $anchor `referencing` cannot read
            raise self._unreadable("#", exc) from None
        self._walk(root, resolver)
        self._component, self._sizes = self._components()
        self._leaving = self._between()

    def _node(self, schema: object, place: tuple, resolver, pending: list) -> int:
        found = self._index.get(id(schema))
        if found is not None:
            return found
        number = len(self._places)
        self._index[id(schema)] = number
        self._keep.append(schema)
        self._places.append(place)
        self.edges.append([])
        pending.append((number, schema, resolver))
        return number

    def where(self, node: int) -> str:
        """Where `node` was found: a JSON pointer from the root, or from the $ref that reached it first."""
        keys: list[str] = []
        place = self._places[node]
        while len(place) > 1:
            keys.extend(_escape(key) for key in reversed(place[1:]))
            place = self._places[place[0]]
        return "/".join([place[0], *reversed(keys)])

    def _walk(self, root: object, resolver) -> None:
        pending: list = []
        self._node(root, ("#",), resolver, pending)
        while pending:
            number, schema, resolver = pending.pop()
            if not isinstance(schema, dict):
                continue  # true / false: a leaf
            try:
                here = resolver.in_subresource(self._specification.create_resource(schema)) if self._named \
                    else resolver
            except Exception as exc:  # noqa: BLE001 - an $id `referencing` cannot read (not a string, ...)
                raise self._unreadable(self.where(number), exc) from None
            for child, place in _children(schema, number, self):
                self.edges[number].append(self._node(child, place, here, pending))
            ref = schema.get("$ref")
            if isinstance(ref, str):
                try:
                    resolved = here.lookup(ref)
                except Unresolvable:
                    raise SchemaRefused("ref", f"the JSON schema in {self.param} has \"$ref\": {ref[:100]!r} at "
                                        f"{self.where(number)[:200]}, which does not resolve within the schema "
                                        "(the worker never fetches one from elsewhere); define it under $defs and "
                                        "refer to it as \"#/$defs/NAME\"", param=self.param) from None
                except Exception as exc:  # noqa: BLE001 - a reference `referencing` cannot parse
                    raise self._unreadable(self.where(number), exc) from None
                self.edges[number].append(self._node(resolved.contents, (ref,), resolved.resolver, pending))

    def _unreadable(self, where: str, exc: Exception) -> SchemaRefused:
        return SchemaRefused("ref", f"the JSON schema in {self.param} has a $schema, $id, $anchor or $ref near "
                             f"{where[:200]} that cannot be resolved ({type(exc).__name__}: {str(exc)[:100]}); "
                             "give $id and $anchor as strings, or drop them and refer to \"#/$defs/NAME\"",
                             param=self.param)

    def _components(self) -> tuple[list[int], list[int]]:
        """Tarjan's strongly connected components, iteratively: each node's component, and each component's
        size; components are numbered so that every edge leads to a component numbered lower or equal."""
        count = len(self.edges)
        order, low, component = [-1] * count, [0] * count, [-1] * count
        sizes: list[int] = []
        stack: list[int] = []
        on_stack = [False] * count
        counter = 0
        for start in range(count):
            if order[start] != -1:
                continue
            work = [(start, 0)]
            while work:
                node, at = work.pop()
                if at == 0:
                    order[node] = low[node] = counter
                    counter += 1
                    stack.append(node)
                    on_stack[node] = True
                edges = self.edges[node]
                while at < len(edges):
                    target = edges[at]
                    at += 1
                    if order[target] == -1:
                        work.append((node, at))
                        work.append((target, 0))
                        break
                    if on_stack[target]:
                        low[node] = min(low[node], order[target])
                else:
                    if low[node] == order[node]:
                        size = 0
                        while True:
                            member = stack.pop()
                            on_stack[member] = False
                            component[member] = len(sizes)
                            size += 1
                            if member == node:
                                break
                        sizes.append(size)
                    if work:
                        parent = work[-1][0]
                        low[parent] = min(low[parent], low[node])
                    continue
        return component, sizes

    def _between(self) -> list[list[int]]:
        """Each component's edges to other components (one entry per edge: a definition used twice, twice)."""
        component = self._component
        leaving: list[list[int]] = [[] for _ in self._sizes]
        for node, edges in enumerate(self.edges):
            leaving[component[node]].extend(component[t] for t in edges if component[t] != component[node])
        return leaving

    def deepest(self) -> tuple[int, list[str]]:
        """The depth, and where the deepest path passes (one place per component on it)."""
        component, sizes, leaving = self._component, self._sizes, self._leaving
        depth, below = [0] * len(sizes), [-1] * len(sizes)
        for c in range(len(sizes)):  # every edge leads lower: the ones below are done
            best = max(leaving[c], key=lambda t: depth[t], default=-1)
            depth[c] = sizes[c] + (depth[best] if best != -1 else 0)
            below[c] = best
        first = {}
        for node in range(len(component) - 1, -1, -1):
            first[component[node]] = node
        path, at = [], component[0]
        while at != -1:
            path.append(self.where(first[at]))
            at = below[at]
        return depth[component[0]], path

    def expanded(self, budget: int) -> int:
        """The expanded size, counted up to budget + 1 (past it, the count stops growing)."""
        component, sizes, leaving = self._component, self._sizes, self._leaving
        total = [0] * len(sizes)
        for c in range(len(sizes)):
            total[c] = min(budget + 1, sizes[c] + sum(total[t] for t in leaving[c]))
        return total[component[0]]


def _children(schema: dict, node: int, graph: "_Graph") -> Iterator[tuple[object, tuple]]:
    """The subschemas `schema` (node `node`) holds directly, each with where it lies (its parent and the keys
    from there); a list or map wider than MAX_WIDTH is refused."""
    for key, value in schema.items():
        kind = _KIND.get(key)
        if kind is None:
            continue
        if isinstance(value, list):
            if kind & _LIST:
                _check_width(key, len(value), graph, node)
                for i, child in enumerate(value):
                    if isinstance(child, (dict, bool)):
                        yield child, (node, key, i)
        elif isinstance(value, dict) and kind & _MAP:
            _check_width(key, len(value), graph, node)
            for name, child in value.items():
                if isinstance(child, (dict, bool)):
                    yield child, (node, key, name)
        elif isinstance(value, (dict, bool)) and kind & _ONE_SCHEMA:
            yield value, (node, key)


def _check_width(key: str, width: int, graph: "_Graph", node: int) -> None:
    if width > MAX_WIDTH:
        raise SchemaRefused("width", f"the JSON schema in {graph.param} has {width} entries in {key} at "
                            f"{graph.where(node)[:200]} "
                            f"(at most {MAX_WIDTH}); split it, or describe the entries with fewer alternatives",
                            param=graph.param)


def _names_resources(root: object) -> bool:
    """Whether any subschema carries $id or $anchor (only then must the registry be crawled)."""
    pending = [root]
    while pending:
        value = pending.pop()
        if isinstance(value, dict):
            if "$id" in value or "$anchor" in value or "id" in value:
                return True
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)
    return False


def _escape(name: object) -> str:
    return str(name).replace("~", "~0").replace("/", "~1")


def _path(places: list[str]) -> str:
    shown = [p[:80] for p in places]
    if len(shown) > _SHOWN_STEPS + 1:
        shown = shown[:_SHOWN_STEPS] + [f"... ({len(places) - _SHOWN_STEPS - 1} more)", shown[-1]]
    return " -> ".join(shown)
