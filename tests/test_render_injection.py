"""Hostile ElasticModel values: each is rendered inert (proven by parsing the output) or rejected with a
typed error, and never writes outside the output tree."""
from __future__ import annotations

from dataclasses import replace

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.rendering.compose import compose
from controller.rendering.compose_errors import InvalidName
from controller.rendering import quote, render
from controller.rendering.quote import yaml_quote
from controller.types import Pending, Plan
from tests.compose_scenario import SLOTS, decide, model

HOSTILE = {
    "newline-hostnetwork": "org/evil\nhostNetwork: true",
    "document-separator": "org/evil\n---\napiVersion: v1\nkind: Pod",
    "double-and-single-quotes": "org/\"ev'il\"",
    "backslashes": "org\\evil\\\"",
    "jinja-expression": "{{ 7*7 }}",
    "jinja-statement": "{% for x in range(3) %}x{% endfor %}",
    "colon-space-and-comment": "org/evil: true # comment",
    "flow-mapping": "{hostNetwork: true}",
    "anchor-and-tag": "&a !!python/object:os.system",
    "unicode": "组织/модель-é",
    "astral-emoji": "org/😀-model",
    "control-characters": "org/\x00\x07\x1b[31m\x7f\u2028\u0085",
    "crlf-and-tab": "org/a\r\n\tb",
    "long-300": "org/" + "x" * 296,
}


@pytest.mark.parametrize("value", HOSTILE.values(), ids=HOSTILE.keys())
def test_quote_round_trips_through_yaml(value):
    for loader in (yaml.SafeLoader, yaml.CSafeLoader):
        assert yaml.load(f"key: {yaml_quote(value)}\nother: 1\n", Loader=loader) == {"key": value, "other": 1}


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_quote_round_trips_any_text(value):
    for loader in (yaml.SafeLoader, yaml.CSafeLoader):  # compose parses with libyaml
        assert yaml.load(f"- {yaml_quote(value)}", Loader=loader) == [value]


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from("ab :#-\"\\\n\t\r\x00\x7fé😀") | st.characters(), max_size=60))
def test_multiline_ascii_is_escaped_as_character_by_character(value):
    assert quote._escaped(value) == quote._NEEDS_ESCAPE.sub(quote._escape, value)


def _pass(hub: str):
    """One model served on a slot and one awaiting a profile, both with model id `hub`."""
    served = model("served", hub=hub)
    waiting = model("waiting", hub=hub)
    plan = Plan(decisions=(decide(served, "resident", SLOTS[0], need=1, footprint=1),),
                pending=(Pending(name="waiting", namespace="llm", model=hub, gpu_product=SLOTS[0].product,
                                 revision="main", reason="no profile"),))
    result = compose([served, waiting], plan, SLOTS[:1])
    assert result.errors == ()
    return {(d["kind"], d["metadata"].get("namespace", "")): d for path, text in result.files.items()
            if path.endswith(".yaml") and path.startswith("rendered/") for d in yaml.safe_load_all(text)}


def _key_paths(node, prefix=()):
    if isinstance(node, dict):
        return {p for k, v in node.items() for p in _key_paths(v, prefix + (k,))} | {prefix}
    if isinstance(node, list):
        return {p for i, v in enumerate(node) for p in _key_paths(v, prefix + (i,))} | {prefix}
    return {prefix}


@pytest.fixture(scope="module")
def benign():
    return _pass("org/benign")


@pytest.mark.parametrize("hub", HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_model_id_renders_inert(benign, hub):
    objects = _pass(hub)
    assert objects.keys() == benign.keys(), "no object added or lost"
    for key, doc in objects.items():
        assert _key_paths(doc) == _key_paths(benign[key]), f"{key}: the structure changed"
    job = objects[("Job", "llm")]
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--model") + 1] == hub
    assert "hostNetwork" not in job["spec"]["template"]["spec"]
    assert job["metadata"]["annotations"]["gpushare.dev/model"] == hub
    assert objects[("Service", "gpushare-system")]["metadata"]["annotations"]["gpushare.dev/model"] == hub
    config = yaml.safe_load(objects[("ConfigMap", "gpushare-system")]["data"]["worker.yaml"])
    assert [m["model"] for m in config["models"]] == [hub]


@pytest.mark.parametrize("namespace, name", [
    pytest.param("llm", "x" * 300, id="name-300-chars"),
    pytest.param("llm", "../../x", id="name-path-traversal"),
    pytest.param("../../etc", "x", id="namespace-path-traversal"),
    pytest.param("llm", "Chat", id="name-uppercase"),
    pytest.param("llm", "a\nhostNetwork: true", id="name-newline"),
    pytest.param("", "x", id="namespace-empty"),
])
def test_unusable_names_are_rejected_and_others_render(namespace, name):
    bad = replace(model("ok"), name=name, namespace=namespace)
    good = model("good")
    plan = Plan(decisions=(decide(bad, "resident", SLOTS[0], need=1, footprint=1),
                           decide(good, "resident", SLOTS[0], need=1, footprint=1)),
                pending=(Pending(name=name, namespace=namespace, model="org/m", gpu_product=SLOTS[0].product,
                                 revision="main", reason="no profile"),))
    result = compose([bad, good], plan, SLOTS[:1])
    assert [(type(e), e.ref) for e in result.errors] == [(InvalidName, f"{namespace}/{name}")] * 2
    assert "decisions/llm/good.yaml" in result.files
    for path in result.files:
        assert path.split("/")[0] in ("rendered", "decisions") and ".." not in path.split("/")
        assert name not in path.split("/")
    config = yaml.safe_load(yaml.safe_load(
        result.files["rendered/gpushare-system/configmap-worker-node-a-gpu0-default.yaml"])["data"]["worker.yaml"])
    assert [m["name"] for m in config["models"]] == ["good"]


def test_hostile_gpu_product_on_a_slot_is_rejected():
    slot = replace(SLOTS[0], product="H200\nhostNetwork: true")
    served = model("served")
    result = compose([served], Plan(decisions=(decide(served, "resident", slot, need=1, footprint=1),)), [slot])
    assert [(type(e), e.ref) for e in result.errors] == [(InvalidName, "llm/served")]
    assert not any("/deployment-" in p for p in result.files)


def test_long_model_id_gets_a_short_hashed_job_name(benign):
    job = _pass(HOSTILE["long-300"])[("Job", "llm")]
    assert len(job["metadata"]["name"]) <= 63
    assert job["metadata"]["name"] != benign[("Job", "llm")]["metadata"]["name"]


@pytest.mark.parametrize("template, context", [
    ("{{ m.name | quote }}", {"m": {"name": "a"}}),
    ("{% for k, v in m.items() %}{{ k | quote }}{% endfor %}", {"m": {"items": 1, "keys": 2}}),
    ("{{ m.get('x') | quote }}", {"m": {"get": "shadowed", "x": "y"}}),
    ("{{ m.items | quote }}", {"m": {"items": "an item"}}),
    ("{{ m.missing | quote }}", {"m": {}}),
    ("{{ m.__class__ | quote }}", {"m": {"__class__": "x"}}),
    ("{{ m.mro | quote }}", {"m": type}),
], ids=["item", "method-beside-a-key-of-its-name", "get-beside-a-key-of-its-name", "method-name-is-the-method",
        "missing-is-an-error", "dunder-stays-sandboxed", "not-a-mapping"])
def test_templates_read_mappings_as_jinjas_sandbox_does(template, context):
    """The sandbox reads a mapping's items without trying the attribute first, and renders what Jinja's own
    sandbox renders (or refuses what it refuses)."""
    from types import MappingProxyType

    from jinja2 import DictLoader
    from jinja2.sandbox import SandboxedEnvironment

    from controller.rendering import render

    def outcome(env, ctx):
        try:
            return env.get_template("t").render(**ctx)
        except Exception as exc:  # noqa: BLE001 - compared by type
            return type(exc)

    ours = render.environment(DictLoader({"t": template}))
    stock = SandboxedEnvironment(loader=DictLoader({"t": template}), undefined=ours.undefined, finalize=ours.finalize,
                                 autoescape=False)
    stock.filters["quote"] = yaml_quote
    for ctx in (context, {k: MappingProxyType(v) if isinstance(v, dict) else v for k, v in context.items()}):
        assert outcome(ours, ctx) == outcome(stock, ctx)
