"""Nothing the Kubernetes API server would refuse reaches git: its rules one at a time (controller.inputs.kube_rules),
every rendered object checked against them in compose (so `validate` and the pass refuse alike), composition
parameters checked against the rules of the fields they fill, and names that collide once sanitised."""
from __future__ import annotations

import copy
import dataclasses
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from compose_scenario import SLOTS, decide, model
from controller.cli.commands import main
from controller.cli.offline import pass_over
from controller.inputs import kube_rules
from controller.rendering.compose import compose
from controller.rendering.compose_errors import InvalidName, InvalidQuantity, InvalidToleration, NameCollision
from controller.inputs.compositions import load_compositions, parse_composition, shipped_compositions
from controller.inputs.kube_rules import custom_resource_problems, object_problems
from controller.rendering.names import service_name
from controller.rendering.site import InstallParameterInvalid, with_install_parameters
from controller.types import Plan
from templates import TEMPLATE_DIR

FLEET = Path(__file__).resolve().parent.parent / "examples" / "fleet"
GIB = 1 << 30

# ---------------------------------------------------------------- each rule, as Kubernetes states it

RULES = [
    # (rule, text, accepted)
    ("dns1123_label", "chat-7b", True), ("dns1123_label", "7b-chat", True), ("dns1123_label", "a" * 64, False),
    ("dns1123_label", "Chat", False), ("dns1123_label", "a.b", False), ("dns1123_label", "-a", False),
    ("dns1123_label", "", False),
    ("dns1123_subdomain", "a.b-c.d", True), ("dns1123_subdomain", "a..b", False),
    ("dns1123_subdomain", ".".join(["a" * 63] * 4), False), ("dns1123_subdomain", "a_b", False),
    ("dns1035_label", "chat", True), ("dns1035_label", "7b-chat", False), ("dns1035_label", "a-", False),
    ("dns1035_label", "a" * 64, False),
    ("path_segment_name", "a:b", True), ("path_segment_name", "..", False), ("path_segment_name", "a/b", False),
    ("path_segment_name", "a%b", False),
    ("qualified_name", "nvidia.com/gpu", True), ("qualified_name", "Gpu_Type.x", True),
    ("qualified_name", "gpu type", False), ("qualified_name", "/x", False), ("qualified_name", "a/b/c", False),
    ("qualified_name", "Example.com/x", False), ("qualified_name", "x" * 64, False), ("qualified_name", "x/", False),
    ("label_value", "", True), ("label_value", "NVIDIA-H200", True), ("label_value", "a b", False),
    ("label_value", "x" * 64, False), ("label_value", "-x", False),
    ("quantity", "500m", True), ("quantity", "2", True), ("quantity", "1.5", True), ("quantity", "16Gi", True),
    ("quantity", "1e3", True), ("quantity", ".5", True), ("quantity", "+1", True), ("quantity", "-0", True),
    ("quantity", "two", False), ("quantity", "16 GB", False), ("quantity", "16GB", False), ("quantity", "1K", False),
    ("quantity", "-1", False), ("quantity", "", False), ("quantity", "1.2.3", False),
    ("container_image", "repo/worker:1", True), ("container_image", " repo/worker:1", False),
    ("container_image", "", False),
]


@pytest.mark.parametrize("rule, text, accepted", [pytest.param(*case, id=f"{case[0]}-{case[1][:20]!r}-"
                                                               f"{'ok' if case[2] else 'refused'}") for case in RULES])
def test_each_rule(rule, text, accepted):
    assert (getattr(kube_rules, rule)(text) == []) == accepted


TOLERATIONS = [
    ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}, []),
    ({"operator": "Exists"}, []),
    ({"key": "a", "value": "b"}, []),
    ({"key": "a", "effect": "NoExecute", "tolerationSeconds": 5}, []),
    ({"key": "gpu type", "operator": "Exists"}, ["tolerations[0].key"]),
    ({"value": "b"}, ["tolerations[0].operator"]),
    ({"key": "a", "operator": "Exists", "value": "b"}, ["tolerations[0].value"]),
    ({"key": "a", "value": "b c"}, ["tolerations[0].value"]),
    ({"key": "a", "effect": "NoSchedule", "tolerationSeconds": 5}, ["tolerations[0].effect"]),
    ({"key": "a", "operator": "In"}, ["tolerations[0].operator"]),
    ({"key": "a", "effect": "Sometimes"}, ["tolerations[0].effect"]),
]


@pytest.mark.parametrize("toleration, wrong", [pytest.param(t, w, id=f"{'-'.join(w) or 'ok'}-{i}")
                                               for i, (t, w) in enumerate(TOLERATIONS)])
def test_tolerations(toleration, wrong):
    assert [p.where for p in kube_rules.tolerations([toleration])] == wrong


# ---------------------------------------------------------------- one rendered object

def _rendered_objects():
    models = [model("chat")]
    plan = Plan(decisions=(decide(models[0], "resident", SLOTS[0], need=GIB, footprint=GIB),))
    rendered = compose(models, plan, SLOTS[:1])
    assert not rendered.errors
    return {obj.kind: yaml.safe_load(rendered.files[path]) for path, obj in rendered.objects.items()}


RENDERED = _rendered_objects()
POD = ("spec", "template", "spec")


def _set(kind, path, value):
    def edit(doc):
        node = doc
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return kind, edit


OBJECT_CASES = [
    pytest.param(*_set("Service", ("metadata", "name"), "7b-chat"), "InvalidName", "metadata.name",
                 id="service-name-with-a-leading-digit"),
    pytest.param(*_set("ConfigMap", ("metadata", "name"), "a..b"), "InvalidName", "metadata.name",
                 id="configmap-name-not-a-subdomain"),
    pytest.param(*_set("Role", ("metadata", "name"), ".."), "InvalidName", "metadata.name", id="role-name-dot-dot"),
    pytest.param(*_set("Namespace", ("metadata", "name"), "a.b"), "InvalidName", "metadata.name",
                 id="namespace-not-a-label"),
    pytest.param(*_set("Deployment", ("metadata", "labels"), {"gpu type": "x"}), "InvalidLabel", "metadata.labels",
                 id="label-key-with-a-space"),
    pytest.param(*_set("Deployment", ("metadata", "labels"), {"a": "x" * 64}), "InvalidLabel", "metadata.labels.a",
                 id="label-value-too-long"),
    pytest.param(*_set("Deployment", ("metadata", "annotations"), {"a b": "x"}), "InvalidAnnotation",
                 "metadata.annotations", id="annotation-key-with-a-space"),
    pytest.param(*_set("Deployment", ("metadata", "annotations"), {"a": "x" * (256 << 10)}), "InvalidAnnotation",
                 "metadata.annotations", id="annotations-over-256KiB"),
    pytest.param(*_set("Deployment", (*POD, "nodeSelector"), {"k": "a b"}), "InvalidLabel",
                 "spec.template.spec.nodeSelector.k", id="node-selector-value"),
    pytest.param(*_set("Deployment", ("spec", "selector", "matchLabels"), {"k/": "v"}), "InvalidLabel",
                 "spec.selector.matchLabels", id="selector-key"),
    pytest.param(*_set("Service", ("spec", "selector"), {"k": "a b"}), "InvalidLabel", "spec.selector.k",
                 id="service-selector-value"),
    pytest.param(*_set("NetworkPolicy", ("spec", "ingress", 0, "from", 0, "namespaceSelector", "matchExpressions"),
                       [{"key": "a b", "operator": "In", "values": ["x"]}]), "InvalidLabel",
                 "spec.ingress[0].from[0].namespaceSelector.matchExpressions[0].key", id="expression-key"),
    pytest.param(*_set("Deployment", (*POD, "containers", 0, "resources", "requests", "cpu"), "two"),
                 "InvalidQuantity", "spec.template.spec.containers[0].resources.requests.cpu", id="cpu-two"),
    pytest.param(*_set("Deployment", (*POD, "containers", 0, "resources", "requests", "memory"), "-1Gi"),
                 "InvalidQuantity", "spec.template.spec.containers[0].resources.requests.memory",
                 id="negative-memory"),
    pytest.param(*_set("Deployment", (*POD, "tolerations"), [{"key": "gpu type", "operator": "Exists"}]),
                 "InvalidToleration", "spec.template.spec.tolerations[0].key", id="toleration-key-with-a-space"),
]


@pytest.mark.parametrize("kind, edit, reason, where", OBJECT_CASES)
def test_an_object_the_api_server_refuses_names_the_rule_and_field(kind, edit, reason, where):
    doc = copy.deepcopy(RENDERED[kind])
    assert object_problems(doc) == []
    edit(doc)
    assert [(p.reason, p.where) for p in object_problems(doc)][:1] == [(reason, where)]


ELASTIC_MODEL = {"apiVersion": "gpushare.dev/v1alpha1", "kind": "ElasticModel",
                 "metadata": {"name": "chat", "namespace": "llm", "labels": {"team": "a"},
                              "annotations": {"gpushare.dev/source": "clusters/eu-1/models/chat.yaml"}},
                 "spec": {"model": "Qwen/Qwen2.5-0.5B-Instruct", "memoryBudget": "4Gi"}}

CUSTOM_RESOURCE_CASES = [
    # (case id, edit, the first problem's (reason, field); None: the API server takes it)
    ("as-written", lambda d: None, None),
    ("name-with-capitals", lambda d: d["metadata"].update(name="Chat"), ("InvalidName", "metadata.name")),
    ("name-with-a-dot-is-a-subdomain", lambda d: d["metadata"].update(name="chat.v2"), None),
    ("namespace-with-a-dot", lambda d: d["metadata"].update(namespace="llm.a"), ("InvalidName", "metadata.namespace")),
    ("label-key-with-a-space", lambda d: d["metadata"]["labels"].update({"a b": "x"}),
     ("InvalidLabel", "metadata.labels")),
    ("label-value-too-long", lambda d: d["metadata"]["labels"].update(team="x" * 64),
     ("InvalidLabel", "metadata.labels.team")),
    ("annotations-over-256-KiB", lambda d: d["metadata"]["annotations"].update(big="x" * (256 << 10)),
     ("InvalidAnnotation", "metadata.annotations")),
    # a custom resource's spec is its CRD schema's alone: a field there named like a Pod's is not a label map
    ("spec-field-named-nodeSelector", lambda d: d["spec"].update(nodeSelector={"a b": "not a label"}), None),
    ("spec-field-named-resources", lambda d: d["spec"].update(resources={"limits": {"cpu": "lots"}}), None),
]


@pytest.mark.parametrize("case, edit, first", CUSTOM_RESOURCE_CASES, ids=[c[0] for c in CUSTOM_RESOURCE_CASES])
def test_a_custom_resource_is_held_to_the_rules_of_its_metadata_only(case, edit, first):
    doc = copy.deepcopy(ELASTIC_MODEL)
    edit(doc)
    found = [(p.reason, p.where) for p in custom_resource_problems(doc)]
    assert found[:1] == ([] if first is None else [first])


def test_every_shipped_object_passes():
    assert all(object_problems(doc) == [] for doc in RENDERED.values())


# ---------------------------------------------------------------- compose: the broken model alone

def test_a_model_whose_name_starts_with_a_digit_is_refused_alone():
    digit, good = model("7b-chat"), model("chat")
    plan = Plan(decisions=tuple(decide(m, "resident", SLOTS[0], need=GIB, footprint=GIB) for m in (digit, good)))
    rendered = compose([digit, good], plan, SLOTS[:1])
    assert [(type(e), e.ref) for e in rendered.errors] == [(InvalidName, "llm/7b-chat")]
    error = rendered.errors[0]
    assert "DNS-1035" in error.message and "Service llm/7b-chat" in error.message
    assert "metadata.name of the ElasticModel llm/7b-chat" in error.fix
    assert "rendered/llm/service-chat.yaml" in rendered.files and "decisions/llm/chat.yaml" in rendered.files
    assert not any("7b-chat" in path for path in rendered.files)
    config = yaml.safe_load(yaml.safe_load(rendered.files[
        "rendered/gpushare-system/configmap-worker-node-a-gpu0-default.yaml"])["data"]["worker.yaml"])
    assert [m["name"] for m in config["models"]] == ["chat"]  # its worker does not serve it either


def test_a_namespace_that_starts_with_a_digit_gets_a_service_name_kubernetes_accepts():
    served = model("chat", "1team")
    rendered = compose([served], Plan(decisions=(decide(served, "resident", SLOTS[0], need=GIB, footprint=GIB),)),
                       SLOTS[:1])
    assert rendered.errors == ()
    name = service_name("1team", "chat")
    assert name.startswith("m-1team-chat-") and kube_rules.dns1035_label(name) == []
    assert service_name("llm", "chat") == "llm-chat-" + service_name("llm", "chat").rsplit("-", 1)[1]  # unchanged


def _with(composition: str, **parameters):
    shipped = shipped_compositions()[composition]
    return {**shipped_compositions(), composition: dataclasses.replace(
        shipped, parameters={**shipped.parameters, **parameters}, source="compositions/team.yaml")}


@pytest.mark.parametrize("parameters, error, field", [
    pytest.param({"workerCpu": "two"}, InvalidQuantity, "spec.parameters.workerCpu", id="worker-cpu-two"),
    pytest.param({"tolerations": [{"key": "gpu type", "operator": "Exists"}]}, InvalidToleration,
                 "spec.parameters.tolerations[0].key", id="toleration-key-gpu-type"),
])
def test_a_composition_value_kubernetes_refuses_fails_its_models_and_names_the_parameter(parameters, error, field):
    team, other = model("chat"), model("coder", composition="hami", product="NVIDIA-L4")
    plan = Plan(decisions=(decide(team, "resident", SLOTS[0], need=GIB, footprint=GIB),
                           decide(other, "resident", SLOTS[1], need=GIB, footprint=GIB)))
    rendered = compose([team, other], plan, SLOTS, compositions=_with("default", **parameters))
    assert [(type(e), e.ref) for e in rendered.errors] == [(error, "llm/chat")]
    assert f"{field} in compositions/team.yaml" in rendered.errors[0].fix
    assert "decisions/llm/coder.yaml" in rendered.files and not any("node-a" in p for p in rendered.files)


def test_two_slots_whose_worker_names_collide_are_not_merged():
    """`worker-` + node + `-gpuN-` + composition: node a-gpu0-x under `default` and node a under
    `x-gpu0-default` join into one name."""
    slots = (replace(SLOTS[0], node="a-gpu0-x"), replace(SLOTS[0], node="a"))
    shifted = dataclasses.replace(shipped_compositions()["default"], name="x-gpu0-default")
    first, second = model("first"), model("second", composition="x-gpu0-default")
    plan = Plan(decisions=(decide(first, "resident", slots[0], need=GIB, footprint=GIB),
                           decide(second, "resident", slots[1], need=GIB, footprint=GIB)))
    rendered = compose([first, second], plan, slots,
                       compositions={**shipped_compositions(), "x-gpu0-default": shifted})
    assert [(type(e), e.ref) for e in rendered.errors] == [(NameCollision, "llm/second")]
    message = rendered.errors[0].message
    assert "a/gpu0" in message and "a-gpu0-x/gpu0" in message and "'x-gpu0-default'" in message
    assert "'default'" in message and "worker-a-gpu0-x-gpu0-default" in message
    assert "gpus.yaml" in rendered.errors[0].fix and "compositionRef" in rendered.errors[0].fix
    config = yaml.safe_load(yaml.safe_load(rendered.files[
        "rendered/gpushare-system/configmap-worker-a-gpu0-x-gpu0-default.yaml"])["data"]["worker.yaml"])
    assert [m["name"] for m in config["models"]] == ["first"]


@pytest.mark.parametrize("processes", [1, 2, 3], ids=["one-process", "two-processes", "three-processes"])
def test_a_collision_is_found_however_many_processes_render(monkeypatch, processes):
    """A large pass renders disjoint groups of slots in forked processes: slots whose workers would take one
    name must render in the same group, or the collision surfaces as an OutputConflict with no sources named.
    Colliding slots sit far apart in id order, with other slots between them."""
    from controller.rendering import compose as compose_module
    monkeypatch.setattr(compose_module, "PARALLEL_MIN_DECISIONS", 1)
    between = tuple(replace(SLOTS[0], node=f"m{i}") for i in range(4))
    slots = (replace(SLOTS[0], node="a"), *between, replace(SLOTS[0], node="z-gpu0-x"), replace(SLOTS[0], node="z"))
    shifted = dataclasses.replace(shipped_compositions()["default"], name="x-gpu0-default")
    models = [model(f"m{i}") for i in range(len(between))]
    first, second = model("first"), model("second", composition="x-gpu0-default")
    plan = Plan(decisions=(*(decide(m, "resident", s, need=GIB, footprint=GIB) for m, s in zip(models, between)),
                           decide(model("lone"), "resident", slots[0], need=GIB, footprint=GIB),
                           decide(first, "resident", slots[5], need=GIB, footprint=GIB),
                           decide(second, "resident", slots[6], need=GIB, footprint=GIB)))
    every = [*models, model("lone"), first, second]
    compositions = {**shipped_compositions(), "x-gpu0-default": shifted}
    serial = compose(every, plan, slots, compositions=compositions)
    rendered = compose(every, plan, slots, compositions=compositions, processes=processes)
    assert [(type(e), e.ref) for e in rendered.errors] == [(NameCollision, "llm/second")]
    assert rendered.errors[0].message == serial.errors[0].message and rendered.files == serial.files


# ---------------------------------------------------------------- composition parameters, where they are read

COMPOSITION = {"apiVersion": "gpushare.dev/v1alpha1", "kind": "Composition", "metadata": {"name": "team"},
               "spec": {"steps": {"profiling": {"perModel": ["profiler-job.yaml.j2"]},
                                  "serving": {"perWorker": ["worker-deployment.yaml.j2"],
                                              "perModel": ["model-service.yaml.j2"]}}}}


@pytest.mark.parametrize("parameters, path, reason", [
    pytest.param({"workerCpu": "two"}, "spec.parameters.workerCpu", "InvalidQuantity", id="worker-cpu-two"),
    pytest.param({"profilerCpu": "-1"}, "spec.parameters.profilerCpu", "InvalidQuantity", id="negative-cpu"),
    pytest.param({"profilerMemory": "16 GB"}, "spec.parameters.profilerMemory", "InvalidQuantity",
                 id="profiler-memory-16-GB"),
    pytest.param({"kaiQueue": "a b"}, "spec.parameters.kaiQueue", "InvalidLabel", id="kai-queue-not-a-label-value"),
    pytest.param({"image": "repo/worker:1 "}, "spec.parameters.image", "InvalidImage", id="image-trailing-space"),
    pytest.param({"tolerations": [{"key": "gpu type", "operator": "Exists"}]}, "spec.parameters.tolerations[0].key",
                 "InvalidToleration", id="toleration-key-gpu-type"),
    pytest.param({"tolerations": [{"key": "a", "operator": "Exists", "value": "b"}]},
                 "spec.parameters.tolerations[0].value", "InvalidToleration", id="toleration-exists-with-value"),
    pytest.param({"tolerations": [{"key": "a", "tolerationSeconds": 3}]}, "spec.parameters.tolerations[0].effect",
                 "InvalidToleration", id="toleration-seconds-without-no-execute"),
    pytest.param({"workerCpu": "500m", "profilerMemory": "16Gi", "tolerations": []}, None, None, id="valid"),
])
def test_composition_parameters_are_checked_against_the_fields_they_fill(parameters, path, reason):
    doc = copy.deepcopy(COMPOSITION)
    doc["spec"]["parameters"] = parameters
    composition, errors = parse_composition(doc, "compositions/team.yaml")
    assert [(e.path, e.reason) for e in errors] == ([(path, reason)] if path else [])
    assert (composition is None) == bool(path)


def test_shipped_compositions_pass_their_own_checks(tmp_path):
    copied = tmp_path / "templates"
    shutil.copytree(TEMPLATE_DIR, copied)
    default = copied / "compositions" / "default.yaml"
    default.write_text(default.read_text().replace("workerNamespace: gpushare-system",
                                                   "workerNamespace: gpushare-system\n    workerCpu: two"))
    with pytest.raises(Exception, match="parameters.workerCpu: 'two'.*InvalidQuantity"):
        load_compositions(copied)


def test_an_install_parameter_is_checked_like_the_field_it_fills():
    with pytest.raises(InstallParameterInvalid, match="leading or trailing whitespace"):
        with_install_parameters(shipped_compositions(), {"image": " registry/worker:1"})


@pytest.mark.parametrize("edit, reason, needle", [
    pytest.param(("models/llm/chat.yaml", "name: chat", "name: 7b-chat"), "InvalidName", "7b-chat",
                 id="model-name-with-a-leading-digit"),
    pytest.param(("compositions/team.yaml", "workerNamespace: llm-workers",
                  "workerNamespace: llm-workers\n    workerCpu: two"), "InvalidQuantity", "cpu: two",
                 id="composition-worker-cpu-two"),
    pytest.param(("compositions/team.yaml", "workerNamespace: llm-workers",
                  "workerNamespace: llm-workers\n    profilerMemory: 16 GB"), "InvalidQuantity", "16 GB",
                 id="composition-profiler-memory-16-GB"),
    pytest.param(("compositions/team.yaml", "workerNamespace: llm-workers",
                  "workerNamespace: llm-workers\n    tolerations: [{key: gpu type, operator: Exists}]"),
                 "InvalidToleration", "gpu type", id="composition-toleration-key-gpu-type"),
])
def test_validate_and_the_pass_refuse_it_and_nothing_of_it_is_rendered(edit, reason, needle, tmp_path, capsys):
    root = tmp_path / "fleet"
    shutil.copytree(FLEET, root)
    team = copy.deepcopy(COMPOSITION)
    team["spec"]["parameters"] = {"workerNamespace": "llm-workers"}
    (root / "compositions").mkdir()
    (root / "compositions" / "team.yaml").write_text(yaml.safe_dump(team, sort_keys=False))
    chat = root / "models" / "llm" / "chat.yaml"  # its second model, summarizer, takes the team's composition
    chat.write_text(chat.read_text().replace("product: NVIDIA-L4", "product: NVIDIA-L4\n  compositionRef: {name: team}"))
    path, old, new = edit
    (root / path).write_text((root / path).read_text().replace(old, new))

    output = pass_over(root, processes=1)
    code = main(["validate", str(root)])
    printed = capsys.readouterr().out

    assert reason in {e.reason for e in output.errors} and code == 1 and f"[{reason}]" in printed
    rendered = [text for file, text in output.files.items() if file.startswith("rendered/") and file.endswith(".yaml")]
    assert rendered and not any(needle.encode() in text for text in rendered)
    assert any(b"assistant-8b" in text for text in rendered)  # the others render
