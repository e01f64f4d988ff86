"""Loader and validator: YAML documents -> ElasticModels, Profiles, GpuSlots, Pools, and one InputError per problem.

Owns turning user and controller files into the typed inputs of a reconcile
pass. Pure: the parsers (`load_documents`, `parse_model`, `parse_profile`,
`parse_gpu_inventory` (its pools through controller.inputs.pools), `combine`) take text or parsed documents, never paths. The
one reader of a GitOps directory (controller.inputs.reader) feeds them files;
cluster mode feeds them custom resources, ConfigMap contents and node labels.
A bad file or document never stops the others loading.

Every schema violation becomes exactly one InputError per JSON path, with a
PascalCase reason, a message that says what is wrong and a fix.
"""
from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Mapping

import yaml
from jsonschema import ValidationError
from jsonschema.exceptions import relevance

import schemas
from contract.gpu_catalog import capability_of
from contract.precision import AUTO, canonical, product_problem
from contract.quantity import QuantityError, parse_bytes
from contract.wire import API_VERSION
from controller.inputs.pools import check_pools, pool_from
from controller.inputs.profilecheck import profile_problem
from controller.inputs.yamlin import YamlLimits, parse_documents
from controller.inputs.kube_rules import label_value, labels as label_problems, qualified_name
from controller.placement import Placement, PlacementError, parse_placement
from controller.policy import PolicyError, parse_policy
from controller.types import (DEFAULT_COMPOSITION, DEFAULT_NAMESPACE, SLO, Decision, ElasticModel,
                              GpuSlot, InputError, Inputs, Pool, Profile, Source)

_SEPARATOR = re.compile(r"^---(?:[ \t].*)?\r?$", re.MULTILINE)
_DNS_LABEL = schemas.load("elasticmodel")["$defs"]["dns1123Label"]
_QUANTITY_PATTERN = schemas.load("elasticmodel")["$defs"]["quantity"]["oneOf"][1]["pattern"]
_SHOWN_CHARS = 40
INT64_MAX = 2**63 - 1

Documents = list[tuple[int, Any]]


# ---------------------------------------------------------------- YAML text -> documents

def load_documents(text: str, file: str, limits: YamlLimits | None = None) -> tuple[Documents, list[InputError]]:
    """Each non-empty YAML document of `text` with its 0-based index; one InputError per unparseable document.

    Documents are split on `---` lines first, so a broken document does not hide the ones after it.
    Empty documents (a lone `---`) are skipped; indexes count them, as `yaml.safe_load_all` does.
    Every document is held to `limits` (default: `YamlLimits.from_env()`): alias expansion, depth, string keys.
    """
    limits = limits or YamlLimits.from_env()
    try:  # the whole file at once; only a file with a broken document is parsed document by document
        docs = parse_documents(text, unique_keys=True, limits=limits)
        return [(i, doc) for i, doc in enumerate(docs) if doc is not None], []
    except (yaml.YAMLError, RecursionError, ValueError, OverflowError):
        pass
    documents: Documents = []
    errors: list[InputError] = []
    for index, (first_line, chunk) in enumerate(_split_documents(text)):
        try:
            found = [doc for doc in parse_documents(chunk, unique_keys=True, limits=limits) if doc is not None]
        except yaml.YAMLError as exc:
            errors.append(_yaml_error(exc, file, index, first_line))
            continue
        except (RecursionError, ValueError, OverflowError) as exc:  # a scalar PyYAML cannot construct
            errors.append(InputError(file=file, document=index, path="", reason="InvalidYAML",
                                     message=f"a value cannot be read ({type(exc).__name__}); the document is not read",
                                     fix="check the document's numbers, dates and tags"))
            continue
        documents += [(index, doc) for doc in found[:1]]
    return documents, errors


def _split_documents(text: str) -> list[tuple[int, str]]:
    """(first line number, text) of each document; text before the first `---` counts only if it has content."""
    starts = [m.start() for m in _SEPARATOR.finditer(text)]
    bounds = [0] + starts if not starts or starts[0] != 0 else starts
    chunks = [(text.count("\n", 0, b), text[b:e]) for b, e in zip(bounds, bounds[1:] + [len(text)])]
    if starts and starts[0] != 0 and not _has_content(chunks[0][1]):
        chunks = chunks[1:]
    return chunks


def _has_content(chunk: str) -> bool:
    return any(line.strip() and not line.lstrip().startswith("#") for line in chunk.splitlines())


def _yaml_error(exc: yaml.YAMLError, file: str, index: int, first_line: int) -> InputError:
    mark = getattr(exc, "problem_mark", None)
    where = f"line {first_line + mark.line + 1}, column {mark.column + 1}: " if mark else ""
    problem = getattr(exc, "problem", None) or type(exc).__name__
    return InputError(file=file, document=index, path="", reason="InvalidYAML",
                      message=f"{where}{problem}; the document cannot be parsed",
                      fix="fix the YAML syntax there (indentation, quoting, a missing ':' or a repeated key)")


# ---------------------------------------------------------------- schema errors -> one InputError per path

def _json_path(parts: Iterable[Any]) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _show(value: Any) -> str:
    if isinstance(value, (dict, list)):  # the offending token only, never a structure's content
        return f"a {'mapping' if isinstance(value, dict) else 'sequence'} of {len(value)} item(s)"
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else f"{text[:_SHOWN_CHARS]}… ({len(str(value))} characters)"


def schema_errors(doc: Any, schema: str, file: str, document: int | None, obj: str | None) -> list[InputError]:
    """One InputError per offending JSON path (the most relevant violation there), in path order; at a number
    that is not finite or beyond 64 bits, that (the schema cannot see it). Every path is checked, so a caller
    that skips the parts with an error (a GPU inventory's bad nodes) never reads an unchecked one."""
    best = {e.path: e for e in _number_errors(doc, file, document, obj)}
    _whole_floats_to_ints(doc)
    if not best and schemas.is_valid(schema)(doc):
        return []
    for err in sorted(schemas.validator(schema).iter_errors(doc), key=relevance, reverse=True):
        for path, reason, message, fix in _explain(err, schema):
            best.setdefault(path, InputError(file=file, document=document, path=path, message=message, fix=fix,
                                             reason=reason, object=obj))
    return [best[p] for p in sorted(best)]


def _explain(err: ValidationError, schema: str) -> list[tuple[str, str, str, str]]:
    """(path, reason, message, fix) for one jsonschema violation, in words a user can act on."""
    path = _json_path(err.absolute_path)
    at = path or "the document"
    if err.validator == "additionalProperties":
        allowed = sorted(err.schema.get("properties", {}))
        extra = sorted(set(err.instance) - set(allowed))
        return [_unknown_field(_json_path([*err.absolute_path, name]), allowed) for name in extra]
    if err.validator == "required":
        missing = [_json_path([*err.absolute_path, name]) for name in err.validator_value if name not in err.instance]
        return [(full, "MissingField", f"{full} is required", f"add {full}") for full in missing]
    if err.schema == _DNS_LABEL:
        return [(path, "InvalidName", f"{at} {_show(err.instance)} is not a DNS-1123 label",
                 "use at most 63 characters: lower-case letters, digits and '-', starting and ending with a "
                 "letter or digit (e.g. chat-small)")]
    if err.validator == "oneOf" and any(b.get("pattern") == _QUANTITY_PATTERN for b in err.validator_value):
        return [(path, "InvalidQuantity", *_quantity_problem(at, err.instance))]
    if err.validator in ("const", "enum"):
        expected = err.validator_value if err.validator == "const" else " or ".join(map(str, err.validator_value))
        return [(path, "InvalidValue", f"{at} is {_show(err.instance)}; it must be {expected}",
                 f"set {at} to {expected}")]
    if err.validator == "type":
        return [(path, "InvalidType", f"{at} is a YAML {_yaml_type(err.instance)}, not of type {err.validator_value}",
                 f"write {at} as a {err.validator_value}")]
    words = _RULES.get(err.validator)
    rule = words.format(err.validator_value) if words else f"breaks the schema's {err.validator} rule"
    return [(path, "InvalidSpec", f"{at} is {_show(err.instance)}; it {rule}",  # never jsonschema's message: it
             f"correct {at} as schemas/{schema}.schema.json describes")]  # quotes the whole value


_RULES = {"minimum": "must be at least {}", "maximum": "must be at most {}", "exclusiveMinimum": "must be above {}",
          "exclusiveMaximum": "must be below {}", "minLength": "must have at least {} characters",
          "maxLength": "must have at most {} characters", "pattern": "must match the pattern {}",
          "minItems": "must have at least {} items", "maxItems": "must have at most {} items",
          "uniqueItems": "must not repeat an item", "multipleOf": "must be a multiple of {}"}


def _unknown_field(path: str, allowed: list[str]) -> tuple[str, str, str, str]:
    if path == "spec.mode":
        return (path, "ModeNotAllowed",
                "spec.mode is not a field: the operator assigns the mode (resident, swap or elastic) from the "
                "model's profile and its memoryBudget, and reports it in status.assigned",
                "delete spec.mode; to influence the mode, change spec.memoryBudget or spec.slo")
    return (path, "UnknownField", f"{path} is not a known field",
            f"remove it or fix its spelling; allowed here: {', '.join(allowed)}")


def _to_bytes(value: Any) -> int | None:
    """Bytes in a quantity the schema accepted (an integral YAML float such as 1.5e9 included); None if not one."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    try:
        return parse_bytes(value)
    except QuantityError:
        return None


def _quantity_problem(at: str, value: Any) -> tuple[str, str]:
    if isinstance(value, float):
        return (f"{at} is the YAML number {value!r}; a quantity is a whole number of bytes or a string",
                "quote it with a suffix, e.g. '1.5Gi' or '500M'")
    if not isinstance(value, (int, str)) or isinstance(value, bool):
        return f"{at} is a {type(value).__name__}, not a quantity", "write a quantity such as 4Gi or 500M"
    try:
        amount = parse_bytes(value)
    except QuantityError as exc:
        return f"{at}: {exc}", "write a quantity such as 4Gi, 4096Mi, 1.5Gi, 16G or 500M"
    if amount < 1:
        return f"{at} is {amount} bytes; it must be at least 1 byte", "write a positive quantity such as 4Gi"
    return (f"{at}: {_show(value)} is not written as a Kubernetes quantity",
            "write a number with an optional suffix, e.g. 4Gi, 4096Mi, 1.5Gi, 16G or 500M")


def _whole_floats_to_ints(doc: Any) -> None:
    """Every whole YAML float (`count: 1.0`, `memoryBudget: 1.5e9`) becomes the int it equals, in place: JSON
    Schema counts it as an integer, and the values read from the document are then ints wherever the schema
    asks for one (a GPU count that reaches range(), a token count that sizes a tensor)."""
    stack = [doc]
    while stack:
        node = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, value in items:
            if isinstance(value, float) and value.is_integer():
                node[key] = int(value)
            elif isinstance(value, dict | list):
                stack.append(value)


def _number_errors(doc: Any, file: str, document: int | None, obj: str | None) -> list[InputError]:
    """One InputError per number that is not finite (.nan, .inf) or lies beyond the 64-bit range: the schema
    cannot say so (JSON has no NaN), and such a number would turn every sum it enters into nonsense."""
    errors = []
    stack: list[tuple[list, Any]] = [([], doc)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, dict):
            stack += [([*path, key], item) for key, item in value.items()]
        elif isinstance(value, list):
            stack += [([*path, i], item) for i, item in enumerate(value)]
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            at = _json_path(path) or "the document"
            if isinstance(value, float) and not math.isfinite(value):
                errors.append(InputError(file, document, _json_path(path), reason="InvalidNumber", object=obj,
                                         message=f"{at} is {value!r}, not a finite number",
                                         fix=f"write {at} as an ordinary number (not .nan or .inf)"))
            elif abs(value) > INT64_MAX:
                errors.append(InputError(file, document, _json_path(path), reason="InvalidNumber", object=obj,
                                         message=f"{at} is {_show(value)}, beyond the 64-bit range (±{INT64_MAX})",
                                         fix=f"write {at} as a realistic number"))
    return sorted(errors, key=lambda e: e.path)


# ---------------------------------------------------------------- documents -> typed values

def kind_error(doc: Any, kind: str, file: str, document: int | None) -> InputError | None:
    if not isinstance(doc, dict):
        return InputError(file=file, document=document, path="", reason="NotAnObject",
                          message=f"expected a {kind} mapping, found a YAML {_yaml_type(doc)}",
                          fix=f"write the document as a YAML mapping with apiVersion: {API_VERSION} and kind: {kind}")
    if doc.get("kind") != kind:
        return InputError(file=file, document=document, path="kind", reason="WrongKind",
                          message=f"expected kind {kind} ({API_VERSION}) here, found {_show(doc.get('kind'))}",
                          fix=f"only {kind} documents belong here: move this one elsewhere or correct its kind")
    return None


def _yaml_type(value: Any) -> str:
    """The kind of a value, never its content (a file's text must not reach a log)."""
    return {str: "string", list: "sequence", int: "integer", float: "number", bool: "boolean"}.get(
        type(value), type(value).__name__)


def parse_model(doc: Any, source: Source, *, keep_document: bool = False
                ) -> tuple[ElasticModel | None, list[InputError]]:
    """An ElasticModel from one document (a file's or a custom resource's), or the errors that prevent it;
    `keep_document`: the model holds `doc` (ElasticModel.document: a repository with clusters/ renders it)."""
    wrong = kind_error(doc, "ElasticModel", source.file, source.document)
    if wrong:
        return None, [wrong]
    meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    ref = f"{meta.get('namespace') or DEFAULT_NAMESPACE}/{meta.get('name')}" if meta.get("name") else None
    errors = schema_errors(doc, "elasticmodel", source.file, source.document, ref)
    if errors:
        return None, errors
    spec = doc["spec"]
    budget = _to_bytes(spec["memoryBudget"])
    if budget is None or budget < 1:
        return None, [InputError(source.file, source.document, "spec.memoryBudget",
                                 *_quantity_problem("spec.memoryBudget", spec["memoryBudget"]),
                                 reason="InvalidQuantity", object=ref)]
    slo = spec.get("slo")
    product = (spec.get("gpu") or {}).get("product")
    weights = canonical((spec.get("weights") or {}).get("dtype"))
    cannot = product_problem(product, capability_of(product), weights) if product else None
    if cannot:
        return None, [InputError(source.file, source.document, "spec.weights.dtype",
                                 f"spec.weights.dtype {weights} cannot run on spec.gpu.product {product}: "
                                 f"{cannot[0]}", cannot[1],
                                 reason="UnsupportedWeightDtype", object=ref)]
    try:
        rightsizing = parse_policy(spec.get("rightsizing"), budget)
    except PolicyError as exc:
        return None, [InputError(source.file, source.document, exc.path, str(exc), exc.fix,
                                 reason="InvalidRightsizing", object=ref)]
    except QuantityError as exc:
        return None, [InputError(source.file, source.document, "spec.rightsizing", str(exc),
                                 "write minBudget and maxBudget as Kubernetes quantities (12Gi)",
                                 reason="InvalidRightsizing", object=ref)]
    try:
        placement = parse_placement(spec.get("placement"))
    except PlacementError as exc:
        return None, [InputError(source.file, source.document, exc.path, str(exc),
                                 "In and NotIn take a list of values; Exists and DoesNotExist take none",
                                 reason=exc.reason, object=ref)]
    bad_labels = _selector_problems(spec.get("placement"))
    if bad_labels:
        path, message = bad_labels[0]
        return None, [InputError(source.file, source.document, path, message,
                                 "write Kubernetes label keys (an optional DNS prefix and '/', then a name) and "
                                 "label values (at most 63 letters, digits, '-', '_' or '.')",
                                 reason="InvalidSelector", object=ref)]
    return ElasticModel(
        name=meta["name"],
        namespace=meta.get("namespace") or DEFAULT_NAMESPACE,
        model=spec["model"],
        budget_bytes=budget,
        slo=SLO(**{field: slo[key] for key, field in _SLO_FIELDS.items() if key in slo}) if slo else SLO(),
        gpu_product=(spec.get("gpu") or {}).get("product"),
        composition=(spec.get("compositionRef") or {}).get("name", DEFAULT_COMPOSITION),
        revision=spec.get("revision", "main"),
        generation=meta.get("generation", 1),
        has_slo=slo is not None,
        source=source,
        served_names=tuple(spec.get("servedNames", ())),
        rightsizing=rightsizing,
        weight_dtype=canonical((spec.get("weights") or {}).get("dtype")),
        placement=placement,
        document=doc if keep_document else None,
    ), []


def placement_of(value: Any) -> Placement | None:
    """The Placement an ElasticModel whose spec.placement is `value` runs with, or None where that value holds an
    error parse_model reports. Checked as parse_model checks a model's (schema, operators, label rules), on a
    model that has nothing else to get wrong, so the rules stay parse_model's alone; the reader asks it of the
    placement it finds in a file before it reads the file further (controller.inputs.placement_probe)."""
    model, errors = parse_model({"apiVersion": API_VERSION, "kind": "ElasticModel", "metadata": {"name": "placed"},
                                 "spec": {"model": "placed", "memoryBudget": "1Gi", "placement": value}},
                                Source("placement", None))
    return None if errors or model is None else model.placement


def _selector_problems(placement: Any) -> list[tuple[str, str]]:
    """(field, what is wrong) of each label key or value of spec.placement.clusterSelector that Kubernetes'
    label rules refuse (controller.inputs.kube_rules)."""
    selector = (placement or {}).get("clusterSelector") if isinstance(placement, dict) else None
    if not isinstance(selector, dict):
        return []
    at = "spec.placement.clusterSelector"
    found = [(p.where, f"{p.where}: {p.message}") for p in label_problems(selector.get("matchLabels") or {},
                                                                            f"{at}.matchLabels")]
    for i, item in enumerate(selector.get("matchExpressions") or ()):
        found += [(f"{at}.matchExpressions[{i}].key", f"key {item['key']!r}: {m}") for m in qualified_name(item["key"])]
        found += [(f"{at}.matchExpressions[{i}].values", f"value {v!r}: {m}")
                  for v in item.get("values") or () for m in label_value(v)]
    return found


_SLO_FIELDS = {"contextTokens": "context_tokens", "concurrency": "concurrency", "ttftMs": "ttft_ms",
               "tpotMs": "tpot_ms"}


def parse_profile(doc: Any, file: str, document: int | None = 0) -> tuple[Profile | None, list[InputError]]:
    """A Profile from one ModelProfile document (a file's or a ConfigMap's), or the errors that prevent it;
    a profile that disagrees with its model's known architecture is refused (controller.profilecheck)."""
    wrong = kind_error(doc, "ModelProfile", file, document)
    if wrong:
        return None, [wrong]
    errors = schema_errors(doc, "profile", file, document, None)
    if errors:
        return None, errors
    w, act = doc["weights"], doc["activation"]
    parts = w["embeddingBytes"] + sum(w["layerBytes"]) + w["finalNormBytes"] + w["headBytes"]
    if parts != w["totalBytes"]:
        return None, [InputError(
            file, document, "weights.totalBytes", reason="ProfileTotalMismatch",
            message=(f"weights.totalBytes is {w['totalBytes']} but embeddingBytes + sum(layerBytes) + "
                     f"finalNormBytes + headBytes = {parts} (off by {w['totalBytes'] - parts})"),
            fix="regenerate the profile (profiler Job or `python -m contract.estimate`) or correct the numbers")]
    profile = Profile(
        model=doc["model"], gpu_product=doc["gpu"]["product"], dtype=doc["dtype"], source=doc["source"],
        method=doc["method"], embedding_bytes=w["embeddingBytes"], layer_bytes=tuple(w["layerBytes"]),
        final_norm_bytes=w["finalNormBytes"], head_bytes=w["headBytes"], tied_embeddings=w["tiedEmbeddings"],
        kv_bytes_per_token=doc["kvCache"]["bytesPerToken"],
        prefill_activation_bytes_per_token=act["prefillBytesPerToken"],
        prefill_chunk_tokens=act["prefillChunkTokens"],
        decode_activation_bytes_per_sequence=act["decodeBytesPerSequence"],
        runtime_overhead_bytes=doc["runtimeOverheadBytes"],
        decode_ms_per_token=float(doc["latency"]["decodeMsPerToken"]),
        prefill_ms_per_1k_tokens=float(doc["latency"]["prefillMsPer1kTokens"]),
        host_to_device_gbps=float(doc["hostToDeviceGBps"]), revision=doc.get("revision", "main"), file=file,
        weight_dtype=w.get("dtype", AUTO),
        decode_step_ms=tuple(sorted((int(p["batch"]), float(p["ms"]))
                                    for p in doc["latency"].get("decodeStepMs", ()))),
    )
    disagrees = profile_problem(profile, architecture=doc.get("architecture"))
    return (None, [replace(disagrees, document=document)]) if disagrees else (profile, [])


@dataclass(frozen=True)
class Inventory:
    """What one GPUInventory document (gpus.yaml) gives the planner: the fixed nodes' GPU slots and the pools."""

    slots: tuple[GpuSlot, ...] = ()
    pools: tuple[Pool, ...] = ()


def parse_gpu_inventory(doc: Any, file: str, document: int | None = 0) -> tuple[Inventory, list[InputError]]:
    """The GPU slots (one per GPU of each node) and the node pools of a GPUInventory document. Bad nodes and bad
    pools are reported and skipped; the others are planned. A pure function of the one document, wherever it
    was read from."""
    wrong = kind_error(doc, "GPUInventory", file, document)
    if wrong:
        return Inventory(), [wrong]
    errors = schema_errors(doc, "gpus", file, document, None)
    if any(not e.path.startswith(("nodes[", "pools[")) for e in errors):
        return Inventory(), errors  # the document itself is broken, not just some of its nodes or pools
    bad = {e.path.split("]")[0] + "]" for e in errors}
    nodes = [(f"nodes[{i}]", n) for i, n in enumerate(doc["nodes"]) if f"nodes[{i}]" not in bad]
    listed = defaultdict(list)
    for path, node in nodes:
        listed[node["name"]].append(path)
    slots: list[GpuSlot] = []
    for path, node in nodes:
        found, problem = _node_slots(node, path, [p for p in listed[node["name"]] if p != path])
        slots += found
        errors += [InputError(file, document, *problem)] if problem else []
    found = []
    for i, item in enumerate(doc.get("pools") or []):
        path = f"pools[{i}]"
        pool, problem = (None, None) if path in bad else _pool(item, path)
        errors += [InputError(file, document, *problem)] if problem else []
        found += [(path, pool)] if pool else []
    pools, pool_errors = check_pools(found, file, document, (n["name"] for _, n in nodes))
    return Inventory(tuple(slots), pools), sorted(errors + pool_errors, key=lambda e: e.path)


def _pool(item: dict, path: str) -> tuple[Pool | None, tuple | None]:
    """One schema-valid pool item as a Pool, or (path, message, fix, reason) of what is wrong with it."""
    quantities = {field: _to_bytes(item[field]) for field in ("memory", "hostMemory") if field in item}
    quantities["reserved"] = _to_bytes(item.get("reserved", "1Gi"))
    for field, value in quantities.items():
        if value is None or value < (0 if field == "reserved" else 1):
            return None, (f"{path}.{field}", *_quantity_problem(f"{path}.{field}", item.get(field, "1Gi")),
                          "InvalidQuantity")
    return pool_from(item, path, quantities.get("memory"), quantities["reserved"], quantities.get("hostMemory"))


def parse_inventory(doc: Any, file: str, document: int | None = 0) -> tuple[tuple[GpuSlot, ...], list[InputError]]:
    """The GPU slots of a GPUInventory (gpus.yaml), with every error of the document (its pools' too)."""
    inventory, errors = parse_gpu_inventory(doc, file, document)
    return inventory.slots, errors


def _node_slots(node: dict, path: str, also_listed: list[str]) -> tuple[list[GpuSlot], tuple | None]:
    """One schema-valid node's slots, or (path, message, fix, reason) of what is wrong with it."""
    if also_listed:
        return [], (f"{path}.name", f"node {node['name']!r} is also listed as {', '.join(also_listed)}",
                    "list each node once; use count for several GPUs on one node", "DuplicateNode")
    memory, reserved = _to_bytes(node["memory"]), _to_bytes(node.get("reserved", "1Gi"))
    host = _to_bytes(node["hostMemory"]) if "hostMemory" in node else None
    if memory is None or reserved is None or ("hostMemory" in node and not host):
        field = "memory" if memory is None else "reserved" if reserved is None else "hostMemory"
        return [], (f"{path}.{field}", *_quantity_problem(f"{path}.{field}", node[field]), "InvalidQuantity")
    if reserved >= memory:
        return [], (f"{path}.reserved", f"reserved ({reserved} bytes) leaves nothing of memory ({memory} bytes)",
                    "lower reserved, or check memory (nvidia.com/gpu.memory is in MiB)", "InvalidQuantity")
    return [GpuSlot(node=node["name"], index=g, product=node["product"], memory_bytes=memory,
                    reserved_bytes=reserved, host_memory_bytes=host) for g in range(node.get("count", 1))], None


# ---------------------------------------------------------------- cross-document checks

def combine(models: Iterable[ElasticModel], profiles: Iterable[Profile], slots: Iterable[GpuSlot],
            errors: Iterable[InputError] = (), pools: Iterable[Pool] = (),
            pool_nodes: Iterable[tuple[str, int]] = (), prices: Mapping[str, float] | None = None) -> Inputs:
    """Inputs from parsed values: a duplicate model name is an error on every occurrence, and none of them
    is planned; duplicate profiles follow `_unique_profiles`."""
    errors = list(errors)
    kept_models = _unique(list(models), lambda m: m.key, _duplicate_model, errors)
    kept_profiles = _unique_profiles(list(profiles), errors)
    return Inputs(models=tuple(kept_models), profiles=tuple(kept_profiles), slots=tuple(slots),
                  errors=tuple(errors), pools=tuple(pools), pool_nodes=tuple(pool_nodes),
                  prices=tuple(sorted((prices or {}).items())))


def _unique(items: list, key: Callable, report: Callable, errors: list[InputError]) -> list:
    groups = defaultdict(list)
    for item in items:
        groups[key(item)].append(item)
    for group in groups.values():
        if len(group) > 1:
            errors.extend(report(item, [o for o in group if o is not item]) for item in group)
    return [item for item in items if len(groups[key(item)]) == 1]


def _unique_profiles(profiles: list[Profile], errors: list[InputError]) -> list[Profile]:
    """One profile per (model, revision, GPU product, weight dtype). A measured profile supersedes estimated ones for its key
    (a profiler Job measured what the estimate only predicted): the estimates are dropped silently.
    Two measured profiles, or two estimated ones with none measured, are an error on each of them
    and none of that key is used."""
    groups = defaultdict(list)
    for profile in profiles:
        groups[profile.key].append(profile)
    kept = []
    for profile in profiles:
        group = groups[profile.key]
        contenders = [p for p in group if p.source == "measured"] or group
        if not any(profile is c for c in contenders):
            continue  # an estimate superseded by a measurement
        if len(contenders) == 1:
            kept.append(profile)
        else:
            errors.append(_duplicate_profile(profile, [c for c in contenders if c is not profile]))
    return kept


def _where(source: Source | None) -> str:
    return "an unknown place" if source is None else f"{source.file} (document {source.document})"


def _duplicate_model(model: ElasticModel, others: list[ElasticModel]) -> InputError:
    src = model.source or Source(file="")
    return InputError(src.file, src.document, "metadata.name", reason="DuplicateName", object=model.ref,
                      message=(f"ElasticModel {model.ref} is also defined in "
                               f"{'; '.join(_where(o.source) for o in others)}; neither is planned"),
                      fix="keep one definition: rename or delete the others (names are unique per namespace)")


def _duplicate_profile(profile: Profile, others: list[Profile]) -> InputError:
    elsewhere = "; ".join(str(o.file) for o in others)
    return InputError(str(profile.file), None, "model", reason="DuplicateProfile",
                      message=(f"a second {profile.source} profile for {profile.model} on {profile.gpu_product}"
                               f"{'' if profile.weight_dtype == AUTO else f' in {profile.weight_dtype}'} is in "
                               f"{elsewhere}; neither is used"),
                      fix="keep one profile per (model, gpu.product, weights.dtype) and source (a measured one supersedes "
                          "an estimated one): delete the stale one")


@dataclass(frozen=True)
class DecisionRecord:
    """What a pass last wrote for one model: its decision and the (last good) spec it was made from."""

    decision: Decision
    model: ElasticModel | None


def revive_last_good(inputs: Inputs, records: Mapping[tuple[str, str], DecisionRecord]) -> tuple[Inputs, tuple[str, ...]]:
    """Add back the last good spec of every model whose document is broken in this pass."""
    valid = {m.key for m in inputs.models}
    broken_refs = {e.object for e in inputs.errors if e.object}
    broken_files = {e.file for e in inputs.errors if not e.object}
    revived = []
    for key, record in sorted(records.items()):
        last_good = record.model
        if key in valid or last_good is None:
            continue
        ref = f"{key[0]}/{key[1]}"
        if ref in broken_refs or (last_good.source is not None and last_good.source.file in broken_files):
            revived.append(last_good)
    if not revived:
        return inputs, ()
    return replace(inputs, models=(*inputs.models, *revived)), tuple(m.ref for m in revived)


def parse_prices(doc: Any) -> dict[str, float]:
    """gpus.yaml's optional `pricePerGpuHour` (GPU product -> price of one GPU-hour), read apart from the slots so
    a price never changes a plan: anything but a finite price >= 0 is left out ({} when there is none)."""
    prices = doc.get("pricePerGpuHour") if isinstance(doc, dict) else None
    if not isinstance(prices, dict):
        return {}
    return {str(k): float(v) for k, v in prices.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0}
