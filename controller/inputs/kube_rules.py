"""Kubernetes' own rules beyond its OpenAPI schema: what the API server refuses in a valid-looking object.

Owns each rule once, as Kubernetes states it (k8s.io/apimachinery/pkg/util/validation and the core
validation of the kinds gpushare renders): object names per kind (DNS-1123 label or subdomain, DNS-1035
label for Services, a path segment for RBAC objects), namespaces, label keys and values (metadata,
selectors, nodeSelector), annotation keys and their total size, resource quantities, and tolerations.
Each rule returns the list of what is wrong ([] when the text passes), like its Go original; `object_problems`
walks one rendered object and returns every Problem with the reason, the field and the rule broken;
`custom_resource_problems` checks a custom resource's metadata, all the API server checks beyond its CRD.
Pure. Called by controller.rendering.compose (every rendered object), controller.rendering.names (the
names it makes), controller.inputs.compositions and controller.rendering.site (composition parameters,
checked against the rules of the fields they fill).
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache

MAX_LABEL = 63
MAX_SUBDOMAIN = 253
MAX_ANNOTATIONS_BYTES = 256 * 1024  # metadata.annotations, keys and values together
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_LABEL = re.compile(rf"^{_LABEL}$")
_DNS1123_SUBDOMAIN = re.compile(rf"^{_LABEL}(\.{_LABEL})*$")
_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
# <sign><number><suffix>: binary SI, decimal SI (n u m "" k M G T P E) or a decimal exponent (resource.Quantity)
_QUANTITY = re.compile(r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?$")
# Maps whose keys are data, not fields: checked as a whole where they appear, never walked into.
_OPAQUE = frozenset({"labels", "annotations", "matchLabels", "nodeSelector", "data", "binaryData", "stringData"})
_TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_TOLERATION_OPERATORS = ("Equal", "Exists")

LABEL_HINT = "at most 63 characters: letters, digits, '-', '_' or '.', beginning and ending with a letter or digit"
KEY_HINT = ("an optional DNS subdomain prefix and '/', then a name of at most 63 characters: letters, digits, '-', "
            "'_' or '.', beginning and ending with a letter or digit (e.g. example.com/gpu-type)")
QUANTITY_HINT = "a non-negative quantity: a number with an optional suffix (500m, 2, 1.5, 16Gi, 500M)"


def _length(text: str, limit: int) -> list[str]:
    return [f"must be no more than {limit} characters"] if len(text) > limit else []


def _matching(text: str, limit: int, pattern: re.Pattern, rule: str) -> list[str]:
    return _length(text, limit) + ([] if pattern.match(text) else [rule])


def dns1123_label(text: str) -> list[str]:
    """A DNS-1123 label: lower-case alphanumerics and '-', alphanumeric ends, at most 63 characters."""
    return _matching(text, MAX_LABEL, _DNS1123_LABEL, "a lowercase RFC 1123 label must consist of lower case "
                     "alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. "
                     "'my-name' or '123-abc')")


def dns1123_subdomain(text: str) -> list[str]:
    """A DNS-1123 subdomain: labels joined by '.', at most 253 characters."""
    return _matching(text, MAX_SUBDOMAIN, _DNS1123_SUBDOMAIN, "a lowercase RFC 1123 subdomain must consist of lower "
                     "case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character "
                     "(e.g. 'example.com')")


def dns1035_label(text: str) -> list[str]:
    """A DNS-1035 label (a Service name): a DNS-1123 label that starts with a letter."""
    return _matching(text, MAX_LABEL, _DNS1035_LABEL, "a DNS-1035 label must consist of lower case alphanumeric "
                     "characters or '-', start with a letter and end with an alphanumeric character (e.g. 'my-name' "
                     "or 'abc-123')")


def path_segment_name(text: str) -> list[str]:
    """A name that is one URL path segment (RBAC objects): not '.' or '..', no '/' or '%'."""
    if text in (".", ".."):
        return [f"may not be {text!r}"]
    return [f"may not contain {c!r}" for c in "/%" if c in text] + ([] if text else ["may not be empty"])


def qualified_name(text: str) -> list[str]:
    """A label or annotation key (and a resource name): [DNS subdomain prefix '/']name."""
    parts = text.split("/")
    if len(parts) > 2:
        return ["a qualified name has at most one '/' (an optional DNS subdomain prefix, then the name)"]
    name, problems = parts[-1], []
    if len(parts) == 2:
        problems = [f"prefix part {p}" for p in dns1123_subdomain(parts[0])] if parts[0] else \
            ["prefix part must be non-empty"]
    if not name:
        return [*problems, "name part must be non-empty"]
    problems += [f"name part {p}" for p in _length(name, MAX_LABEL)]
    if not _QUALIFIED_NAME.match(name):
        problems.append("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
                        "with an alphanumeric character (e.g. 'MyName', 'my.name' or '123-abc')")
    return problems


def label_value(text: str) -> list[str]:
    """A label value: empty, or at most 63 characters, alphanumeric ends, '-', '_' and '.' inside."""
    return _matching(text, MAX_LABEL, _LABEL_VALUE, "a valid label must be an empty string or consist of alphanumeric "
                     "characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. "
                     "'MyValue' or 'my_value')")


def quantity(text: str) -> list[str]:
    """A resource quantity as resource.ParseQuantity reads it, not negative (requests and limits)."""
    if not _QUANTITY.match(text):
        return ["quantities must match the regular expression "
                r"'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$' (e.g. 500m, 2, 1.5Gi, 16G)"]
    if text.startswith("-") and set(text) & set("123456789"):
        return ["must be greater than or equal to 0"]
    return []


def container_image(text: str) -> list[str]:
    """A container image reference: present, without leading or trailing whitespace."""
    if not text:
        return ["an image is required"]
    return ["must not have leading or trailing whitespace"] if text != text.strip() else []


def is_dns_label(text: str) -> bool:
    return not dns1123_label(text)


def is_label_value(text: str) -> bool:
    return not label_value(text)


@dataclass(frozen=True)
class Problem:
    """One rule an object breaks: the PascalCase reason, the field (a JSON path), the value and the rule."""

    reason: str
    where: str
    value: object
    message: str


def tolerations(items: object, where: str = "tolerations") -> list[Problem]:
    """Every rule a list of tolerations breaks (ValidateTolerations)."""
    if not isinstance(items, list):
        return [Problem("InvalidToleration", where, items, "must be a list of tolerations")]
    found = []
    for i, item in enumerate(items):
        at = f"{where}[{i}]"
        if not isinstance(item, dict):
            found.append(Problem("InvalidToleration", at, item, "must be an object {key, operator, value, effect}"))
            continue
        key, operator, value = item.get("key", ""), item.get("operator") or "Equal", item.get("value", "")
        effect = item.get("effect", "")
        if not all(isinstance(x, str) for x in (key, operator, value, effect)):
            found.append(Problem("InvalidToleration", at, item, "key, operator, value and effect must be strings"))
            continue
        found += [Problem("InvalidToleration", f"{at}.key", key, m) for m in (qualified_name(key) if key else [])]
        if not key and operator != "Exists":
            found.append(Problem("InvalidToleration", f"{at}.operator", operator,
                                 "operator must be Exists when `key` is empty, which means \"match all values and "
                                 "all keys\""))
        if "tolerationSeconds" in item and effect != "NoExecute":
            found.append(Problem("InvalidToleration", f"{at}.effect", effect,
                                 "effect must be 'NoExecute' when `tolerationSeconds` is set"))
        if operator == "Equal":
            found += [Problem("InvalidToleration", f"{at}.value", value, m) for m in label_value(value)]
        elif operator == "Exists":
            if value:
                found.append(Problem("InvalidToleration", f"{at}.value", value,
                                     "value must be empty when `operator` is 'Exists'"))
        else:
            found.append(Problem("InvalidToleration", f"{at}.operator", operator,
                                 f"supported values: {', '.join(_TOLERATION_OPERATORS)}"))
        if effect and effect not in _TAINT_EFFECTS:
            found.append(Problem("InvalidToleration", f"{at}.effect", effect,
                                 f"supported values: {', '.join(_TAINT_EFFECTS)}"))
    return found


@lru_cache(maxsize=16384)
def _key_rule(text: str) -> tuple[str, ...]:
    """qualified_name, remembered: the same keys and values recur on every object of a large pass."""
    return tuple(qualified_name(text))


@lru_cache(maxsize=16384)
def _value_rule(text: str) -> tuple[str, ...]:
    return tuple(label_value(text))


def labels(mapping: object, where: str, reason: str = "InvalidLabel") -> list[Problem]:
    """Every rule a map of label keys to label values breaks (metadata.labels, selectors, nodeSelector)."""
    if not isinstance(mapping, dict):
        return [Problem(reason, where, mapping, "must be a map of label keys to label values")]
    found = []
    for key, value in mapping.items():
        key = str(key)
        found += [Problem(reason, where, key, f"key {key!r}: {m}") for m in _key_rule(key)]
        text = value if isinstance(value, str) else None
        found += ([Problem(reason, f"{where}.{key}", value, "must be a string")] if text is None else
                  [Problem(reason, f"{where}.{key}", text, m) for m in _value_rule(text)])
    return found


def annotations(mapping: object, where: str) -> list[Problem]:
    """Annotation keys (qualified names, read in lower case) and their total size."""
    if not isinstance(mapping, dict):
        return [Problem("InvalidAnnotation", where, mapping, "must be a map of strings")]
    found = [Problem("InvalidAnnotation", where, key, f"key {key!r}: {m}")
             for key in map(str, mapping) for m in _key_rule(key.lower())]
    size = sum(len(str(k)) + len(str(v)) for k, v in mapping.items())
    if size > MAX_ANNOTATIONS_BYTES:
        found.append(Problem("InvalidAnnotation", where, f"{size} bytes",
                             f"may not be more than {MAX_ANNOTATIONS_BYTES} bytes (keys and values together)"))
    return found


def resources(value: object, where: str) -> list[Problem]:
    """requests and limits: resource names are qualified names, amounts non-negative quantities."""
    found = []
    for part in ("requests", "limits"):
        amounts = value.get(part) if isinstance(value, dict) else None
        for name, amount in (amounts.items() if isinstance(amounts, dict) else ()):
            at = f"{where}.{part}.{name}"
            found += [Problem("InvalidQuantity", at, name, f"resource name: {m}") for m in qualified_name(str(name))]
            text = str(amount) if isinstance(amount, int | float | str) and not isinstance(amount, bool) else None
            found += ([Problem("InvalidQuantity", at, amount, "must be a quantity")] if text is None else
                      [Problem("InvalidQuantity", at, amount, m) for m in quantity(text)])
    return found


def _job_name(text: str) -> list[str]:
    """A Job's pods carry its name as a label value: a DNS-1123 subdomain of at most 63 characters."""
    return dns1123_subdomain(text) + _length(text, MAX_LABEL)


# The name rule of each kind (the API server's NameIsDNSSubdomain and friends); other kinds: a subdomain.
NAME_RULES: dict[str, Callable[[str], list[str]]] = {
    "Namespace": dns1123_label,
    "Service": dns1035_label,
    "Job": _job_name,
    "Role": path_segment_name,
    "RoleBinding": path_segment_name,
    "ClusterRole": path_segment_name,
    "ClusterRoleBinding": path_segment_name,
}


def name_rule(kind: str) -> Callable[[str], list[str]]:
    return NAME_RULES.get(kind, dns1123_subdomain)


def object_problems(doc: dict) -> list[Problem]:
    """Every rule a rendered object breaks: its name (per kind) and namespace, then, wherever they appear,
    labels and annotations, label selectors and nodeSelectors, resource quantities and tolerations."""
    found = _identity_problems(doc)
    for at, key, value in _fields(doc, ()):
        where = _path(at, key)
        if key == "metadata" and isinstance(value, dict):
            found += labels(value.get("labels", {}), f"{where}.labels")
            found += annotations(value.get("annotations", {}), f"{where}.annotations")
        elif key in ("matchLabels", "nodeSelector") or (key == "selector" and doc.get("kind") == "Service"
                                                        and where == "spec.selector"):
            found += labels(value, where)
        elif key == "matchExpressions" and isinstance(value, list):
            found += _expressions(value, where)
        elif key == "tolerations":
            found += tolerations(value, where)
        elif key == "resources" and isinstance(value, dict):
            found += resources(value, where)
    return found


def custom_resource_problems(doc: dict) -> list[Problem]:
    """Every rule the API server holds a custom resource to beyond its CRD's schema: those of its own metadata (its
    name and namespace, labels and annotations). Its spec is the schema's alone: a field there named like a Pod's
    nodeSelector or resources is no label map or quantity to the API server, and is not checked as one."""
    metadata = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    return (_identity_problems(doc) + labels(metadata.get("labels", {}), "metadata.labels")
            + annotations(metadata.get("annotations", {}), "metadata.annotations"))


def _identity_problems(doc: dict) -> list[Problem]:
    """The rules `doc`'s metadata.name (its kind's) and metadata.namespace break."""
    metadata = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    found = []
    name, namespace = metadata.get("name"), metadata.get("namespace")
    if isinstance(name, str):
        found += [Problem("InvalidName", "metadata.name", name, m) for m in name_rule(str(doc.get("kind")))(name)]
    if isinstance(namespace, str):
        found += [Problem("InvalidName", "metadata.namespace", namespace, m) for m in dns1123_label(namespace)]
    return found


def _expressions(items: list, where: str) -> list[Problem]:
    found = []
    for i, item in enumerate(items):
        item = item if isinstance(item, dict) else {}
        found += [Problem("InvalidLabel", f"{where}[{i}].key", item.get("key"), m)
                  for m in qualified_name(str(item.get("key", "")))]
        found += [Problem("InvalidLabel", f"{where}[{i}].values", v, m)
                  for v in item.get("values") or () for m in label_value(str(v))]
    return found


_CHECKED = frozenset({"metadata", "matchLabels", "nodeSelector", "selector", "matchExpressions", "tolerations",
                      "resources"})


def _fields(node: object, at: tuple) -> Iterator[tuple[tuple, str, object]]:
    """(path of the mapping, key, value) of every mapping entry a rule checks, depth first."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _CHECKED:
                yield at, key, value
            if isinstance(value, dict | list) and key not in _OPAQUE:
                yield from _fields(value, (*at, key))
    elif isinstance(node, list):
        for i, item in enumerate(node):
            if isinstance(item, dict | list):
                yield from _fields(item, (*at, i))


def _path(at: tuple, key: str) -> str:
    """metadata.labels, spec.template.spec.containers[0].resources: the JSON path of `key` under `at`."""
    text = ""
    for part in (*at, key):
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else str(part)
    return text
