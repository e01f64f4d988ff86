"""Reading YAML documents fast: libyaml composes the nodes, plain Python builds the values.

Owns `parse_documents`, which returns what `yaml.load_all(text, Loader=yaml.CSafeLoader)`
returns for the documents gpushare reads in bulk (rendered template output, ElasticModel
files), without PyYAML's generic constructor machinery: mappings, sequences and string
scalars are built directly; every other scalar (ints, bools, floats, timestamps, binary)
goes to PyYAML's own safe constructor, and so do merge keys and non-scalar keys. Called by
controller.rendering.render (template output) and controller.inputs.load (user files, with
`unique_keys=True`: a key repeated in one mapping is an error, not a silent override).
"""
from __future__ import annotations

import yaml

_STR_TAG = "tag:yaml.org,2002:str"
_MERGE_TAG = "tag:yaml.org,2002:merge"


def parse_documents(text: str, *, unique_keys: bool = False) -> list[object]:
    """Every document of `text` (None for an empty one). Raises yaml.YAMLError on bad YAML or, with
    `unique_keys`, a repeated key; RecursionError on a self-referencing alias."""
    loader = yaml.CSafeLoader(text)
    try:
        documents = []
        while loader.check_node():
            documents.append(_build(loader.get_node(), loader, unique_keys))
        return documents
    finally:
        loader.dispose()


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
                                                        f"found duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
    return mapping
