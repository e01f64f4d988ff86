"""The pieces compose is built from: names, device bytes, PLAN.md, composition loading, the sandbox,
and the Kubernetes schema check (kept in agreement with kubernetes_validate itself)."""
from __future__ import annotations

import copy
import re
from dataclasses import replace

import jsonschema
import kubernetes_validate
import pytest
import yaml
from jinja2 import DictLoader

from controller.rendering.compose import compose
from controller.inputs.compositions import CompositionInvalid, load_compositions, shipped_compositions
from controller.rendering.site import with_install_parameters
from controller.rendering.kube_validate import CUSTOM_KINDS, NoSchema, validate_object
from controller.inputs.kube_rules import is_dns_label
from controller.rendering.names import dns_label, profiler_job_name, service_name
from controller.planning.occupancy import device_bytes
from controller.rendering.planmd import decision_changes, plan_markdown
from controller.rendering.render import RenderError, environment, render_documents
from controller.types import Plan
from tests.compose_scenario import CHAT, CODER, DECISIONS, MODELS, PLAN, PREVIOUS, SLOTS, decide, model
from tests.conftest import REPO_ROOT

# --- names ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("parts, expected", [
    pytest.param(("worker", "node-a", "gpu0"), "worker-node-a-gpu0", id="valid-kept-as-is"),
    pytest.param(("llm", "Chat"), re.compile(r"^llm-chat-[0-9a-f]{8}$"), id="uppercase-hashed"),
    pytest.param(("node.example.com",), re.compile(r"^node-example-com-[0-9a-f]{8}$"), id="dots-hashed"),
    pytest.param(("x" * 70,), re.compile(r"^x{54}-[0-9a-f]{8}$"), id="long-cut-to-63"),
    pytest.param(("../../",), re.compile(r"^x-[0-9a-f]{8}$"), id="nothing-usable-left"),
])
def test_dns_label(parts, expected):
    name = dns_label(*parts)
    assert is_dns_label(name)
    assert name == expected if isinstance(expected, str) else expected.match(name), name


def test_dns_label_keeps_inputs_that_sanitise_alike_apart():
    assert dns_label("a.b") != dns_label("a-b") and dns_label("a.b") != dns_label("A.b")
    assert service_name("a", "b-c") != service_name("a-b", "c")
    assert is_dns_label(service_name("n" * 63, "m" * 63))


@pytest.mark.parametrize("changed", ["model", "revision", "product", "version", "concurrency", "context"])
def test_profiler_job_name_is_unique_per_model_revision_product_version_and_measured_load(changed):
    base = {"model": "org/m", "revision": "main", "product": "NVIDIA-H200", "version": "img:1", "concurrency": 4,
            "context": 4096}
    other = base | {changed: base[changed] + (1 if changed in ("concurrency", "context") else "x")}
    name = profiler_job_name(*base.values())
    assert is_dns_label(name) and profiler_job_name(*base.values()) == name
    assert profiler_job_name(*other.values()) != name


# --- bytes on the device ----------------------------------------------------------------------------

def test_device_bytes_adds_resident_and_elastic_and_counts_the_swap_area_once():
    m = model("m")
    decisions = [decide(m, "resident", SLOTS[0], need=5, footprint=5),
                 decide(m, "elastic", SLOTS[0], need=100, footprint=7),
                 decide(m, "swap", SLOTS[0], need=30, footprint=30),
                 decide(m, "swap", SLOTS[0], need=40, footprint=40),
                 decide(m, "refused", None, need=999, footprint=0)]
    assert device_bytes(decisions) == 5 + 7 + 40


# --- PLAN.md ----------------------------------------------------------------------------------------

def test_plan_md_shows_each_slot_with_a_bar_of_bytes_used():
    text = plan_markdown(MODELS, PLAN, SLOTS, decision_changes(PREVIOUS, PLAN), ())
    # node-a/gpu0: chat 2Gi (A) + swap area max(18Gi, 19Gi) = 21Gi of 140Gi usable: 1 + 5 of 40 marks
    assert "## node-a/gpu0 · NVIDIA-H200\n\n`|A~~~~~" + "." * 34 + "|` 21.0Gi of 140.0Gi usable" in text
    assert ("| A | llm/chat-small | resident | 8.0Gi | 2.0Gi | 2.0Gi | 24/24 | - | - / 120.0 ms | - / 8.5 ms | "
            "TPOT ≤ 50 ms (met) |") in text  # a decision without the alone figure (written before it existed)
    assert "| A | research/big-70b | elastic | 20.0Gi | 150.0Gi | 20.0Gi | 9/80 | - | - / 120.0 ms | - / 2600.0 ms | - |" in text
    assert "| llm/fresh | mistralai/Mistral-7B-Instruct-v0.3 | NVIDIA-H200 |" in text
    assert "| llm/huge | BudgetTooSmall |" in text


@pytest.mark.parametrize("previous, plan, expected", [
    pytest.param({}, Plan(decisions=DECISIONS[:1]), ["llm/chat-small: new, resident on node-a/gpu0"], id="new"),
    pytest.param({CHAT.key: DECISIONS[0]}, Plan(decisions=DECISIONS[:1]), [], id="unchanged"),
    pytest.param({CHAT.key: replace(DECISIONS[0], mode="swap")}, Plan(decisions=DECISIONS[:1]),
                 ["llm/chat-small: swap on node-a/gpu0 → resident on node-a/gpu0"], id="mode"),
    pytest.param({CHAT.key: replace(DECISIONS[0], slot="node-b/gpu0")}, Plan(decisions=DECISIONS[:1]),
                 ["llm/chat-small: resident on node-b/gpu0 → resident on node-a/gpu0"], id="slot"),
    pytest.param({CHAT.key: DECISIONS[0]}, Plan(), ["llm/chat-small: resident on node-a/gpu0 → removed"], id="removed"),
    pytest.param({CHAT.key: DECISIONS[0]}, Plan(pending=(replace(PLAN.pending[0], name="chat-small"),)),
                 ["llm/chat-small: resident on node-a/gpu0 → awaiting a profile"], id="awaiting-profile"),
    pytest.param({CODER.key: replace(DECISIONS[3], name="coder", namespace="llm", resident_layers=12)},
                 Plan(decisions=(replace(DECISIONS[3], name="coder", namespace="llm"),)),
                 ["llm/coder: elastic 12/80 layers on node-b/gpu0 → elastic 9/80 layers on node-b/gpu0"],
                 id="resident-layers"),
])
def test_changes_since_the_last_decision(previous, plan, expected):
    assert [c.summary for c in decision_changes(previous, plan)] == expected


def test_plan_md_cells_cannot_break_the_table():
    hostile = replace(PLAN.pending[0], reason="a | b\n| injected | row |")
    text = plan_markdown(MODELS, Plan(pending=(hostile,)), SLOTS, (), ())
    (row,) = [line for line in text.splitlines() if line.startswith("| llm/fresh")]
    assert row.endswith("a \\| b \\| injected \\| row \\| |")


# --- compositions -----------------------------------------------------------------------------------

def test_shipped_compositions_load_with_defaults():
    found = load_compositions()
    assert sorted(found) == ["default", "hami", "kai"]
    assert "worker-deployment-kai.yaml.j2" in found["kai"].per_worker
    assert "worker-networkpolicy.yaml.j2" in found["kai"].per_worker
    assert found["default"].parameters["image"] == "ghcr.io/gpushare/gpushare-worker:0.1.0"
    assert found["hami"].parameters["profilerBackoffLimit"] == 2


def _composition_dir(tmp_path, **files):
    (tmp_path / "compositions").mkdir()
    (tmp_path / "t.yaml.j2").write_text("{}\n")
    for name, text in files.items():
        (tmp_path / "compositions" / f"{name}.yaml").write_text(text)
    return tmp_path


GOOD = """apiVersion: gpushare.dev/v1alpha1
kind: Composition
metadata: {name: NAME}
spec:
  steps:
    profiling: {perModel: [t.yaml.j2]}
    serving: {perWorker: [t.yaml.j2], perModel: [TEMPLATE]}
"""


@pytest.mark.parametrize("files, message", [
    pytest.param({"a": GOOD.replace("NAME", "a").replace("TEMPLATE", "missing.yaml.j2")}, "do not exist",
                 id="missing-template"),
    pytest.param({"a": GOOD.replace("NAME", "x").replace("TEMPLATE", "t.yaml.j2"),
                  "b": GOOD.replace("NAME", "x").replace("TEMPLATE", "t.yaml.j2")}, "a second composition",
                 id="duplicate-name"),
    pytest.param({"a": GOOD.replace("NAME", "a").replace("TEMPLATE", "t.yaml.j2") + "  parameters: {imag: x}\n"},
                 "imag", id="unknown-parameter"),
    pytest.param({"a": GOOD.replace("NAME", "a").replace("TEMPLATE", "../t.yaml.j2")}, "does not match",
                 id="template-outside-dir"),
    pytest.param({"a": "kind: Composition\n"}, "required", id="no-spec"),
    pytest.param({"a": "a: [\n"}, "not YAML", id="broken-yaml"),
])
def test_invalid_compositions_are_refused_with_the_reason(tmp_path, files, message):
    with pytest.raises(CompositionInvalid, match=re.escape(message)):
        load_compositions(_composition_dir(tmp_path, **files))


# --- the sandbox ------------------------------------------------------------------------------------

@pytest.mark.parametrize("source, context, detail", [
    pytest.param("a: {{ x }}", {"x": "v"}, "without `| quote`", id="unquoted-string"),
    pytest.param("a: {{ x }}", {"x": 1.5}, "without `| quote`", id="unquoted-float"),
    pytest.param("a: {{ missing | quote }}", {}, "UndefinedError", id="undefined-name"),
    pytest.param("a: {{ x.__class__.__mro__ | quote }}", {"x": "v"}, "SecurityError", id="sandbox-escape"),
    pytest.param("- a\nb: c", {}, "not YAML", id="broken-output"),
    pytest.param("- {{ x | quote }}", {"x": "v"}, "not a mapping", id="not-an-object"),
])
def test_templates_that_misbehave_fail_to_render(source, context, detail):
    env = environment(DictLoader({"t": source}))
    with pytest.raises(RenderError, match=re.escape(detail)):
        render_documents(env, "t", context)


def test_integers_and_quoted_values_render():
    env = environment(DictLoader({"t": "a: {{ n }}\nb: {{ s | quote }}\nc: {{ n | quote }}\n"}))
    assert [doc for doc, _ in render_documents(env, "t", {"n": 3, "s": "x: y"})] == [{"a": 3, "b": "x: y", "c": "3"}]


# --- the Kubernetes schema check agrees with kubernetes_validate -----------------------------------

def _golden_docs():
    return [yaml.safe_load(p.read_text()) for p in sorted((REPO_ROOT / "tests/golden/scenario/rendered").rglob("*.yaml"))]


def _broken(doc, edit):
    doc = copy.deepcopy(doc)
    edit(doc)
    return doc


def test_schema_check_agrees_with_kubernetes_validate():
    docs = [d for d in _golden_docs() if (d["apiVersion"], d["kind"]) not in CUSTOM_KINDS]
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    service = next(d for d in docs if d["kind"] == "Service")
    cases = docs + [
        _broken(deployment, lambda d: d["spec"].update(replica=1)),
        _broken(deployment, lambda d: d["spec"]["template"]["spec"]["containers"][0].pop("name")),
        _broken(service, lambda d: d["spec"]["ports"][0].update(port="eighty")),
        _broken(service, lambda d: d["metadata"].update(labels={"a": 1})),
    ]
    for doc in cases:
        theirs = _outcome(lambda: kubernetes_validate.validate(doc, "1.30", strict=True))
        ours = _outcome(lambda: validate_object(doc))
        assert ours == theirs, f"{doc['kind']} {doc['metadata'].get('name')}: ours {ours}, kubernetes_validate {theirs}"
    assert sum(1 for doc in cases if _outcome(lambda: validate_object(doc)) != "valid") == 4


def _outcome(check) -> str:
    try:
        check()
    except Exception as exc:  # noqa: BLE001 - the two libraries raise different types for the same verdict
        return "invalid" if "ValidationError" in type(exc).__name__ else type(exc).__name__
    return "valid"


def test_podmonitors_are_checked_against_their_own_schema():
    files = compose(MODELS, PLAN, SLOTS, compositions=with_install_parameters(shipped_compositions(),
                                                                                  {"podMonitor": True})).files
    monitor = next(yaml.safe_load(text) for path, text in files.items() if "/podmonitor-" in path)
    validate_object(monitor)
    with pytest.raises(jsonschema.ValidationError):
        validate_object(_broken(monitor, lambda d: d["spec"]["podMetricsEndpoints"][0].update(interval="often")))
    with pytest.raises(jsonschema.ValidationError):
        validate_object(_broken(monitor, lambda d: d["spec"].update(sampleLimit=1)))


def test_custom_resources_have_no_built_in_schema():
    with pytest.raises(NoSchema):
        validate_object({"apiVersion": "gpushare.dev/v1alpha1", "kind": "ElasticModel", "metadata": {"name": "x"}})


def test_parallel_render_is_byte_identical_to_one_process(monkeypatch):
    import pickle

    from controller.rendering import compose as compose_module
    from controller.inputs.reader import load_repo
    from controller.planning.plan import plan as make_plan
    from controller.rendering.compose_errors import UnknownComposition

    inputs = load_repo(REPO_ROOT / "examples" / "fleet")
    result = make_plan(inputs)
    serial = compose_module.compose(inputs.models, result, inputs.slots)
    monkeypatch.setattr(compose_module, "PARALLEL_MIN_DECISIONS", 1)
    parallel = compose_module.compose(inputs.models, result, inputs.slots, processes=2)
    assert parallel.files == serial.files and parallel.owners == serial.owners
    assert (parallel.objects, parallel.verdict_sources) == (serial.objects, serial.verdict_sources)
    error = pickle.loads(pickle.dumps(UnknownComposition("llm/a", "no such composition", "fix it")))
    assert (error.reason, error.ref, error.message, error.fix) == ("UnknownComposition", "llm/a",
                                                                    "no such composition", "fix it")


def test_a_kind_schema_with_const_still_compiles(monkeypatch):
    """The fast validators compile without exception details (faster: bench/pass_parts.py); a schema that fastjsonschema
    cannot compile that way (`const`) is compiled with them."""
    from controller.rendering import kube_validate

    monkeypatch.setattr(kube_validate, "_kind_schema", lambda *key: {
        "type": "object", "properties": {"kind": {"const": "Widget"}}, "required": ["kind"]})
    kube_validate._fast.cache_clear()
    try:
        check = kube_validate._fast("1.30", "example.com/v1", "Widget")
        check({"kind": "Widget"})
        with pytest.raises(Exception):
            check({"kind": "Gadget"})
    finally:
        kube_validate._fast.cache_clear()
