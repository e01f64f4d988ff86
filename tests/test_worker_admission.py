"""Shape and admission arithmetic: bytes read from config.json and safetensors headers, needs per
mode, refusals with the missing bytes, the swap group's shared area, elastic layer choice."""
from __future__ import annotations

import pytest
from transformers import AutoModelForCausalLM

from contract.footprint import Terms
from worker.admission import admit, need_for
from worker.config import ModelConfig
from engine.memory import available_bytes
from worker.shape import ModelShape, read_shape, shape_from
from worker_support import (  # noqa: F401  (fixtures are used by name)
    FAMILIES, config_document, model_entry, started_worker, single_threaded_torch, tiny_models,
)

LLAMA_8B = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
            "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256, "dtype": "bfloat16"}


def test_kv_bytes_per_token_of_an_8b_llama_in_bf16():
    shape = shape_from(LLAMA_8B, {})
    assert shape.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131072


@pytest.mark.parametrize("case,dtype,expected_layer_bytes", [
    ("checkpoint-dtype", "auto", 4 * 10 * 4),
    ("cast-to-bf16", "bfloat16", 2 * 10 * 4),
])
def test_tensors_are_grouped_by_layer_and_sized_at_the_compute_dtype(case, dtype, expected_layer_bytes):
    config = {"hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2, "vocab_size": 10}
    tensors = {
        "model.embed_tokens.weight": {"dtype": "F32", "shape": [10, 8]},
        "model.layers.0.mlp.weight": {"dtype": "F32", "shape": [10, 4]},
        "model.layers.1.mlp.weight": {"dtype": "F32", "shape": [10, 4]},
        "model.norm.weight": {"dtype": "F32", "shape": [8]},
        "lm_head.weight": {"dtype": "F32", "shape": [10, 8]},
    }
    shape = shape_from(config, tensors, dtype)
    element = 4 if dtype == "auto" else 2
    assert shape.layer_bytes == (expected_layer_bytes, expected_layer_bytes), case
    assert (shape.embedding_bytes, shape.other_bytes) == (80 * element, 88 * element), case


@pytest.mark.parametrize("family", FAMILIES)
def test_shape_read_before_loading_matches_the_loaded_weights(tiny_models, family):
    shape = read_shape(tiny_models[family])
    model = AutoModelForCausalLM.from_pretrained(tiny_models[family], local_files_only=True)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    assert shape.weight_bytes == params
    assert shape.total_layers == 4


def model(name, mode, *, budget=100, layers=None, context=1, concurrency=1, terms=None):
    return ModelConfig(name=name, namespace="llm", model="unused", mode=mode, budget_bytes=budget,
                       context_tokens=context, concurrency=concurrency, resident_layers=layers,
                       footprint=terms)


def flat(*, layers=(10, 10, 10, 10), embedding=5, other=5, kv=1) -> tuple[Terms, ModelShape]:
    """Planned terms with no activation or overhead (needs are easy to read: weights + buffers + KV),
    and a checkpoint shape that matches them exactly."""
    terms = Terms(fixed_bytes=embedding + other, layer_bytes=layers, kv_bytes_per_token=kv,
                  prefill_activation_bytes_per_token=0, decode_activation_bytes_per_sequence=0, overhead_bytes=0)
    shape = ModelShape(dtype="float32", embedding_bytes=embedding, layer_bytes=layers,
                       other_bytes=other,
                       kv_bytes_per_token=kv, hidden_size=0, intermediate_size=0, num_attention_heads=0,
                       num_key_value_heads=0, head_dim=0, mlp_tensors=3, vocab_size=0)
    return terms, shape


def planned(name, mode, **kwargs):
    """(config, shape) of a model the controller planned with `flat` terms."""
    flat_kwargs = {k: kwargs.pop(k) for k in ("layers_bytes",) if k in kwargs}
    terms, shape = flat(**({"layers": flat_kwargs["layers_bytes"]} if flat_kwargs else {}))
    return model(name, mode, terms=terms, **kwargs), shape


BUFFERS = 2 * 10  # two streaming buffers of one 10-byte layer


@pytest.mark.parametrize("case,mode,layers,expected", [
    ("resident-all-weights", "resident", None, 50 + 4),
    ("swap-all-weights", "swap", None, 50 + 4),
    ("elastic-2-layers-plus-two-buffers", "elastic", 2, 5 + 5 + 20 + BUFFERS + 4),
    ("elastic-all-layers-no-buffers", "elastic", 4, 50 + 4),
])
def test_need_by_mode(case, mode, layers, expected):
    config, shape = planned("m", mode, layers=layers, context=2, concurrency=2)
    assert need_for(config, shape).total == expected, case


def test_model_over_its_budget_is_refused_with_the_missing_bytes():
    [verdict] = admit([planned("big", "resident", budget=40)], 1000, slot="n/gpu0")
    assert (verdict.verdict, verdict.reason, verdict.need_bytes, verdict.available_bytes, verdict.missing_bytes) == (
        "refused", "ExceedsBudget", 51, 40, 11)
    assert "missing" in verdict.message and "raise memoryBudget" in verdict.message


def test_model_over_the_slot_capacity_is_refused_while_the_others_are_applied():
    verdicts = admit([planned("a", "resident"),
                      planned("big", "resident", budget=500, layers_bytes=(40,) * 4),
                      planned("c", "resident")], 120, slot="n/gpu0")
    assert [(v.name, v.verdict, v.reason) for v in verdicts] == [
        ("a", "applied", "Applied"), ("big", "refused", "InsufficientMemory"), ("c", "applied", "Applied")]
    big = verdicts[1]
    assert (big.need_bytes, big.available_bytes, big.missing_bytes) == (171, 69, 102)


def test_swap_group_takes_its_largest_need_not_the_sum():
    members = [planned(n, "swap", layers_bytes=(10,) * k) for n, k in (("s1", 4), ("s2", 2), ("s3", 4))]
    verdicts = admit(members + [planned("r", "resident")], 51 + 51, slot="n/gpu0")
    assert [v.verdict for v in verdicts] == ["applied"] * 4, "swap area is 51 bytes, the resident model fits beside"


def test_elastic_without_a_count_keeps_as_many_layers_as_its_budget_allows():
    buffers = 2 * 100  # k resident: 10 + 100k + buffers + 1
    config, shape = planned("e", "elastic", budget=10 + 450 + buffers + 1, layers_bytes=(100,) * 8)
    [verdict] = admit([(config, shape)], 1 << 30, slot="s")
    assert (verdict.verdict, verdict.resident_layers, verdict.need_bytes) == ("applied", 4, 10 + 400 + buffers + 1)


def test_elastic_with_too_many_configured_layers_is_refused():
    [verdict] = admit([planned("e", "elastic", budget=60, layers=3)], 1 << 30, slot="s")
    need = 5 + 5 + 30 + BUFFERS + 1  # embeddings, other, 3 layers, 2 buffers, KV
    assert (verdict.verdict, verdict.reason, verdict.missing_bytes) == ("refused", "ExceedsBudget", need - 60)


@pytest.mark.parametrize("case,real,expected", [
    ("layer-larger-than-planned", dict(layers=(10, 10, 11, 10)), "decoder layer 2 holds 11 bytes"),
    ("embeddings-larger-than-planned", dict(embedding=6), "embeddings, norm and head hold 11 bytes"),
    ("more-layers-than-planned", dict(layers=(10,) * 5), "5 decoder layers, the plan assumed 4"),
    ("kv-larger-than-planned", dict(kv=2), "2 bytes per token, the plan assumed 1"),
])
def test_a_checkpoint_larger_than_its_planned_terms_is_refused_not_loaded(case, real, expected):
    terms, _ = flat()
    _, shape = flat(**real)
    [verdict] = admit([(model("m", "resident", budget=1 << 20, terms=terms), shape)], 1 << 30, slot="s")
    assert (verdict.verdict, verdict.reason) == ("refused", "ProfileMismatch"), case
    assert expected in verdict.message and "re-profile" in verdict.message, case


def test_a_checkpoint_smaller_than_its_planned_terms_is_admitted_by_the_planned_need():
    terms, _ = flat()
    _, shape = flat(layers=(9, 9, 9, 9))
    [verdict] = admit([(model("m", "resident", budget=1 << 20, terms=terms), shape)], 1 << 30, slot="s")
    assert (verdict.verdict, verdict.need_bytes) == ("applied", 51)


@pytest.mark.parametrize("case,capacity,free,expected", [
    ("cpu-no-probe-uses-capacity", 100, None, 100),
    ("driver-reports-less-free", 100, 60, 60),
    ("capacity-is-the-cap", 100, 500, 100),
])
def test_available_bytes_is_the_smaller_of_capacity_and_free(case, capacity, free, expected):
    assert available_bytes(capacity, lambda: free) == expected, case


def test_worker_admits_against_the_probed_free_memory(tiny_models):
    document = config_document([model_entry("fits-alone", tiny_models["llama"], "resident")])
    worker = started_worker(document, probe=lambda: 1 << 20)  # the driver says only 1 MiB is free
    try:
        [entry] = worker.status()["models"]
    finally:
        worker.stop()
    assert (entry["verdict"], entry["reason"], entry["availableBytes"]) == ("refused", "InsufficientMemory", 1 << 20)
    assert entry["missingBytes"] == entry["needBytes"] - (1 << 20)
