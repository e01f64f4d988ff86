"""The loader/validator: every broken file or document reported once, with file, document, path and reason;
everything beside it still loads."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from controller.inputs.load import combine, load_documents, parse_inventory, parse_model, parse_profile
from controller.inputs.reader import load_repo, read_repo
from controller.types import SLO, ElasticModel, GpuSlot, Source

FIXTURES = Path(__file__).resolve().parent / "fixtures"
BROKEN, GOOD = FIXTURES / "broken", FIXTURES / "load"
GI = 2**30

# (case id, file, document, path, reason, words the message must contain)
BROKEN_CASES = [
    ("bad-yaml", "models/bad-yaml.yaml", 1, "", "InvalidYAML", "line 9"),
    ("bad-quantity", "models/bad-quantity.yaml", 0, "spec.memoryBudget", "InvalidQuantity", "'4GB'"),
    ("spec-mode-set", "models/mode-set.yaml", 1, "spec.mode", "ModeNotAllowed", "operator assigns the mode"),
    ("unknown-field", "models/unknown-field.yaml", 0, "spec.replicas", "UnknownField", "spec.replicas"),
    ("name-300-chars", "models/bad-name.yaml", 0, "metadata.name", "InvalidName", "300 characters"),
    ("duplicate-name-first", "models/dup-a.yaml", 0, "metadata.name", "DuplicateName", "models/dup-b.yaml"),
    ("duplicate-name-second", "models/dup-b.yaml", 0, "metadata.name", "DuplicateName", "models/dup-a.yaml"),
    ("wrong-kind", "models/wrong-kind.yaml", 0, "kind", "WrongKind", "'ConfigMap'"),
    ("profile-total-mismatch", "profiles/NVIDIA-H200/bad-total.yaml", 0, "weights.totalBytes",
     "ProfileTotalMismatch", "off by 1"),
    ("duplicate-profile-first", "profiles/NVIDIA-L4/dup-1.yaml", None, "model", "DuplicateProfile", "dup-2.yaml"),
    ("duplicate-profile-second", "profiles/NVIDIA-L4/dup-2.yaml", None, "model", "DuplicateProfile", "dup-1.yaml"),
]


@pytest.fixture(scope="module")
def broken():
    return load_repo(BROKEN)


@pytest.mark.parametrize("file,document,path,reason,words", [c[1:] for c in BROKEN_CASES],
                         ids=[c[0] for c in BROKEN_CASES])
def test_each_broken_input_is_reported_once_where_it_is(broken, file, document, path, reason, words):
    found = [e for e in broken.errors if e.file == file]
    assert len(found) == 1, found
    error = found[0]
    assert (error.document, error.path, error.reason) == (document, path, reason)
    assert words in error.message
    assert error.fix


def test_broken_repo_reports_nothing_else(broken):
    assert len(broken.errors) == len(BROKEN_CASES), [(e.file, e.path, e.reason) for e in broken.errors]


def test_good_documents_beside_broken_ones_still_load(broken):
    assert sorted(m.ref for m in broken.models) == [
        "default/after-bad-yaml", "default/before-bad-yaml", "llm/good-after-mode", "llm/good-before-mode"]
    assert [p.model for p in broken.profiles] == ["example/tiny-llama"]
    assert [s.id for s in broken.slots] == ["h200-a/gpu0"]


def test_spec_mode_error_says_who_assigns_the_mode_and_how_to_fix(broken):
    (error,) = [e for e in broken.errors if e.reason == "ModeNotAllowed"]
    assert "resident, swap or elastic" in error.message
    assert error.fix.startswith("delete spec.mode")
    assert error.object == "llm/wants-resident"


# ---------------------------------------------------------------- a valid repo

def test_valid_repo_loads_every_field():
    inputs = load_repo(GOOD)
    assert inputs.errors == ()  # rendered/garbage.yaml and models/README.md are not read
    coder, chat, plain = inputs.models  # sorted file order: models/coder.yml, models/team-a/chat.yaml
    assert chat == ElasticModel(
        name="chat-small", namespace="llm", model="Qwen/Qwen2.5-0.5B-Instruct", budget_bytes=4 * GI,
        slo=SLO(context_tokens=8192, concurrency=4, ttft_ms=500, tpot_ms=50), gpu_product="NVIDIA-H200",
        composition="vllm-like", generation=3, has_slo=True)
    assert chat.source == Source("models/team-a/chat.yaml", 0)
    assert (plain.namespace, plain.budget_bytes, plain.slo, plain.has_slo, plain.composition, plain.revision) == (
        "default", 4 * GI, SLO(), False, "default", "main")
    assert plain.source == Source("models/team-a/chat.yaml", 2)  # the empty document between counts
    assert (coder.ref, coder.budget_bytes, coder.revision) == ("llm/coder", 1536 * 2**20, "v2")
    assert inputs.slots == (
        GpuSlot("h200-a", 0, "NVIDIA-H200", 143771 * 2**20), GpuSlot("h200-a", 1, "NVIDIA-H200", 143771 * 2**20),
        GpuSlot("l4-a", 0, "NVIDIA-L4", 23034 * 2**20, reserved_bytes=2 * GI))
    (profile,) = inputs.profiles
    assert profile.file == "profiles/NVIDIA-H200/tiny-llama.yaml"
    assert (profile.key, profile.layer_bytes, profile.weight_bytes, profile.kv_bytes_per_token) == (
        ("example/tiny-llama", "main", "NVIDIA-H200", "auto"), (100, 100, 100, 100), 1000, 64)
    assert (profile.prefill_ms_per_1k_tokens, profile.host_to_device_gbps, profile.source) == (3.0, 55.0, "measured")


def test_missing_inventory_means_no_slots_and_no_error(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "m.yaml").write_text((GOOD / "models" / "coder.yml").read_text())
    inputs = load_repo(tmp_path)
    assert (len(inputs.models), inputs.slots, inputs.errors) == (1, (), ())


def test_gpus_yaml_holds_one_inventory(tmp_path):
    first = yaml.safe_dump(_inventory(H200))
    (tmp_path / "gpus.yaml").write_text(f"{first}---\n{first}")
    inputs = load_repo(tmp_path)
    assert [s.id for s in inputs.slots] == ["h200-a/gpu0"]
    assert [(e.file, e.document, e.reason) for e in inputs.errors] == [("gpus.yaml", 1, "ExtraDocument")]


def test_undecodable_file_is_its_own_error(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "latin1.yaml").write_bytes(b"name: caf\xe9\n")
    (error,) = load_repo(tmp_path).errors
    assert (error.file, error.document, error.reason) == ("models/latin1.yaml", None, "UnreadableFile")


# ---------------------------------------------------------------- YAML documents

SPLIT_CASES = [
    ("single-document", "a: 1\n", [(0, {"a": 1})]),
    ("leading-comment-is-not-a-document", "# note\n---\na: 1\n", [(0, {"a": 1})]),
    ("empty-documents-skipped-but-counted", "---\n---\na: 1\n", [(1, {"a": 1})]),
    ("content-before-first-separator", "a: 1\n---\nb: 2\n", [(0, {"a": 1}), (1, {"b": 2})]),
    ("separator-with-comment", "--- # first\na: 1\n---\n", [(0, {"a": 1})]),
    ("separator-text-inside-block-scalar", "a: |\n  ---\n  x\n", [(0, {"a": "---\nx\n"})]),
    ("empty-text", "", []),
    ("windows-line-endings", "a: 1\r\n---\r\nb: 2\r\n", [(0, {"a": 1}), (1, {"b": 2})]),
]


@pytest.mark.parametrize("text,expected", [c[1:] for c in SPLIT_CASES], ids=[c[0] for c in SPLIT_CASES])
def test_documents_and_their_indexes_match_yaml(text, expected):
    documents, errors = load_documents(text, "f.yaml")
    assert (documents, errors) == (expected, [])
    assert documents == [(i, d) for i, d in enumerate(yaml.safe_load_all(text)) if d is not None]


def test_a_broken_document_does_not_hide_the_next_one():
    documents, (error,) = load_documents("a: 1\n---\nb: [\n---\nc: 3\n", "f.yaml")
    assert documents == [(0, {"a": 1}), (2, {"c": 3})]
    assert (error.document, error.reason) == (1, "InvalidYAML")
    assert "line 4" in error.message  # counted from the top of the file, not of the document


def test_a_repeated_key_is_an_error_not_a_silent_override():
    _, (error,) = load_documents("spec:\n  memoryBudget: 4Gi\n  memoryBudget: 40Gi\n", "f.yaml")
    assert error.reason == "InvalidYAML" and "duplicate key 'memoryBudget'" in error.message


# ---------------------------------------------------------------- one ElasticModel document

def _model(spec: dict | None = None, **metadata) -> dict:
    return {"apiVersion": "gpushare.dev/v1alpha1", "kind": "ElasticModel",
            "metadata": {"name": "m", **metadata},
            "spec": {"model": "org/m", "memoryBudget": "4Gi"} if spec is None else spec}


MODEL_ERRORS = [
    ("missing-budget", _model({"model": "org/m"}), [("spec.memoryBudget", "MissingField")]),
    ("zero-budget", _model({"model": "org/m", "memoryBudget": "0"}), [("spec.memoryBudget", "InvalidQuantity")]),
    ("fractional-number-budget", _model({"model": "org/m", "memoryBudget": 1.5}),
     [("spec.memoryBudget", "InvalidQuantity")]),
    ("wrong-api-version", {**_model(), "apiVersion": "gpushare.dev/v1"}, [("apiVersion", "InvalidValue")]),
    ("upper-case-namespace", _model(namespace="LLM"), [("metadata.namespace", "InvalidName")]),
    ("zero-concurrency", _model({"model": "org/m", "memoryBudget": "4Gi", "slo": {"concurrency": 0}}),
     [("spec.slo.concurrency", "InvalidSpec")]),
    ("string-context", _model({"model": "org/m", "memoryBudget": "4Gi", "slo": {"contextTokens": "4k"}}),
     [("spec.slo.contextTokens", "InvalidType")]),
    ("not-a-mapping", ["a", "list"], [("", "NotAnObject")]),
    ("two-problems-two-errors", _model({"model": "org/m", "memoryBudget": "4Gi", "mode": "swap", "replicas": 1}),
     [("spec.mode", "ModeNotAllowed"), ("spec.replicas", "UnknownField")]),
    ("long-upper-case-name-is-one-error", _model(name="X" * 70), [("metadata.name", "InvalidName")]),
]


@pytest.mark.parametrize("doc,expected", [c[1:] for c in MODEL_ERRORS], ids=[c[0] for c in MODEL_ERRORS])
def test_model_document_errors(doc, expected):
    model, errors = parse_model(doc, Source("models/x.yaml", 3))
    assert model is None
    assert [(e.path, e.reason) for e in errors] == expected
    assert all(e.file == "models/x.yaml" and e.document == 3 and e.message and e.fix for e in errors)


def test_an_integral_yaml_float_is_a_quantity():
    model, errors = parse_model(_model({"model": "org/m", "memoryBudget": 1.5e9}), Source("models/x.yaml"))
    assert errors == [] and model.budget_bytes == 1_500_000_000


def test_cluster_mode_parses_a_custom_resource_without_a_file():
    model, errors = parse_model(_model(namespace="llm", generation=7), Source("ElasticModel llm/m"))
    assert errors == [] and (model.ref, model.generation, model.budget_bytes) == ("llm/m", 7, 4 * GI)


# ---------------------------------------------------------------- gpus.yaml and profiles

def _inventory(*nodes) -> dict:
    return {"apiVersion": "gpushare.dev/v1alpha1", "kind": "GPUInventory", "nodes": list(nodes)}


H200 = {"name": "h200-a", "product": "NVIDIA-H200", "memory": "143771Mi"}
INVENTORY_CASES = [
    ("two-gpus-on-one-node", _inventory({**H200, "count": 2}), ["h200-a/gpu0", "h200-a/gpu1"], []),
    ("bad-node-skipped-others-kept", _inventory(H200, {**H200, "name": "l4", "memory": "lots"}),
     ["h200-a/gpu0"], [("nodes[1].memory", "InvalidQuantity")]),
    ("duplicate-node-both-reported", _inventory(H200, H200), [],
     [("nodes[0].name", "DuplicateNode"), ("nodes[1].name", "DuplicateNode")]),
    ("reserved-exceeds-memory", _inventory({**H200, "memory": "1Gi", "reserved": "2Gi"}), [],
     [("nodes[0].reserved", "InvalidQuantity")]),
    ("no-nodes-field", {"apiVersion": "gpushare.dev/v1alpha1", "kind": "GPUInventory"}, [],
     [("nodes", "MissingField")]),
    ("wrong-kind", {**_inventory(H200), "kind": "GPUInventry"}, [], [("kind", "WrongKind")]),
    ("host-memory-not-a-quantity", _inventory({**H200, "hostMemory": "lots"}), [],
     [("nodes[0].hostMemory", "InvalidQuantity")]),
    ("host-memory-zero", _inventory({**H200, "hostMemory": "0Gi"}), [], [("nodes[0].hostMemory", "InvalidQuantity")]),
]


@pytest.mark.parametrize("doc,slots,expected", [c[1:] for c in INVENTORY_CASES],
                         ids=[c[0] for c in INVENTORY_CASES])
def test_inventory(doc, slots, expected):
    found, errors = parse_inventory(doc, "gpus.yaml")
    assert [s.id for s in found] == slots
    assert [(e.path, e.reason) for e in errors] == expected


def test_host_memory_is_the_nodes_and_every_slot_of_it_carries_it():
    found, errors = parse_inventory(_inventory({**H200, "count": 2, "hostMemory": "1Ti"}, {**H200, "name": "b"}),
                                    "gpus.yaml")
    assert errors == []
    assert [(s.id, s.host_memory_bytes) for s in found] == [
        ("h200-a/gpu0", 2**40), ("h200-a/gpu1", 2**40), ("b/gpu0", None)]


def test_measured_decode_steps_are_parsed_sorted_by_batch():
    doc = yaml.safe_load((GOOD / "profiles" / "NVIDIA-H200" / "tiny-llama.yaml").read_text())
    steps = [{"batch": 8, "ms": 10.7}, {"batch": 1, "ms": 7.8}]
    profile, errors = parse_profile({**doc, "latency": {**doc["latency"], "decodeStepMs": steps}}, "p.yaml")
    assert errors == [] and profile.decode_step_ms == ((1, 7.8), (8, 10.7))
    bad = [{"batch": 0, "ms": 1.0}]
    _, errors = parse_profile({**doc, "latency": {**doc["latency"], "decodeStepMs": bad}}, "p.yaml")
    assert [e.path for e in errors] == ["latency.decodeStepMs[0].batch"]


def test_profile_from_a_configmap_payload_has_no_file_io():
    doc = yaml.safe_load((GOOD / "profiles" / "NVIDIA-H200" / "tiny-llama.yaml").read_text())
    profile, errors = parse_profile(doc, "configmap gpushare-system/profile-tiny", None)
    assert errors == [] and profile.file == "configmap gpushare-system/profile-tiny"
    _, errors = parse_profile({**doc, "weights": {**doc["weights"], "layerBytes": []}}, "p.yaml")
    assert [(e.path, e.reason) for e in errors] == [("weights.layerBytes", "InvalidSpec")]


def test_combine_drops_every_copy_of_a_duplicate_and_keeps_the_rest():
    first = ElasticModel("a", "llm", "org/m", GI, source=Source("models/1.yaml", 0))
    second = ElasticModel("a", "llm", "org/m", 2 * GI, source=Source("models/2.yaml", 4))
    other = ElasticModel("b", "llm", "org/m", GI, source=Source("models/2.yaml", 5))
    inputs = combine([first, other, second], [], [])
    assert inputs.models == (other,)
    assert [(e.file, e.document, e.reason) for e in inputs.errors] == [
        ("models/1.yaml", 0, "DuplicateName"), ("models/2.yaml", 4, "DuplicateName")]


# ---------------------------------------------------------------- previous decisions

def test_previous_decisions_load_and_garbled_ones_are_skipped():
    decisions = read_repo(GOOD).last.previous
    assert list(decisions) == [("llm", "chat-small")]  # garbled.yaml and missing-fields.yaml skipped
    decision = decisions[("llm", "chat-small")]
    assert (decision.mode, decision.slot, decision.resident_layers, decision.predicted.tpot_ms) == (
        "resident", "h200-a/gpu0", 24, 0.3)


def test_no_decisions_directory_means_no_previous_decisions(tmp_path):
    assert read_repo(tmp_path).last.previous == {}


@pytest.mark.parametrize("model_id,ok", [
    ("Qwen/Qwen2.5-0.5B-Instruct", True), ("/models/qwen2.5", True), ("/mnt/pvc/org/name@v1", True),
    ("/models/../etc", False), ("org/../x", False), ("../x", False), ("org//x", False), ("a\nhostNetwork: true", False),
], ids=["hub-id", "absolute-path", "nested-path", "dotdot-in-path", "dotdot-in-id", "relative-parent",
        "empty-segment", "newline"])
def test_model_is_a_hub_id_or_an_absolute_path_without_parent_segments(model_id, ok):
    model, errors = parse_model(_model({"model": model_id, "memoryBudget": "4Gi"}), Source("m.yaml"))
    assert (model is not None) == ok, errors
