"""Plan equals admission: the controller's bytes are, byte for byte, what the worker admits.

For random architectures, dtypes, weight dtypes (auto, int8, int4: spec.weights.dtype), SLOs and budgets,
the planner decides from an estimated profile; the controller renders each placed model's worker-config
entry; the worker parses that config, reads the checkpoint's shape by its own arithmetic (worker.shape, from
the tensor table a checkpoint of that architecture has) and admits it. The shape's bytes must equal the
profile's, the worker's need the decision's footprint, and a slot's worker, given the usable memory the plan
assumed, refuses nothing the plan placed.
"""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contract.estimate import architecture_from_config, estimate_profile
from contract.gpu_catalog import CATALOG
from contract.precision import capability_problem
from contract.wire import API_VERSION, WORKER_CONFIG_KIND
from controller.inputs.load import parse_profile
from controller.planning import cost
from controller.planning.plan import plan
from controller.rendering.workerconfig import model_entry
from controller.types import SLO, ElasticModel, GpuSlot, Inputs
from worker.admission import admit
from worker.config import parse_config
from worker.shape import ModelShape, shape_from

GiB = 1 << 30


@st.composite
def architectures(draw) -> dict:
    family = draw(st.sampled_from(["llama", "qwen2", "gpt2"]))
    heads = draw(st.sampled_from([8, 16, 32, 64]))
    hidden = heads * draw(st.sampled_from([64, 128]))
    layers = draw(st.integers(2, 80))
    vocab = draw(st.sampled_from([32_000, 128_256, 151_936]))
    intermediate = hidden * draw(st.sampled_from([2, 3, 4]))
    if family == "gpt2":
        return {"model_type": "gpt2", "n_embd": hidden, "n_head": heads, "n_layer": layers, "vocab_size": vocab,
                "n_positions": 4096, "n_inner": intermediate, "tie_word_embeddings": True}
    return {"model_type": family, "hidden_size": hidden, "num_attention_heads": heads,
            "num_key_value_heads": draw(st.sampled_from([h for h in (1, 2, 4, 8, heads) if heads % h == 0])),
            "num_hidden_layers": layers, "intermediate_size": intermediate, "vocab_size": vocab,
            "max_position_embeddings": 131_072, "tie_word_embeddings": draw(st.booleans())}


@st.composite
def fleets(draw):
    product = draw(st.sampled_from(sorted(CATALOG)))
    gpu = CATALOG[product]
    dtype = draw(st.sampled_from(["bfloat16", "float16", "float32"]))
    count = draw(st.integers(1, 4))
    profiles, models = [], []
    for i in range(count):
        config = draw(architectures())
        weights = draw(st.sampled_from([w for w in ("auto", "int8", "int4")
                                        if capability_problem(gpu.compute_capability, w) is None]))
        doc = estimate_profile(architecture_from_config(config), f"org/m{i}", gpu, dtype, weights_dtype=weights)
        profile, errors = parse_profile(doc, f"profiles/{i}.yaml")
        assert not errors, errors
        profiles.append(profile)
        CONFIGS[f"org/m{i}", weights, profile.dtype] = config
        slo = SLO(context_tokens=draw(st.sampled_from([1, 100, 512, 513, 4096, 32_768])),
                  concurrency=draw(st.integers(1, 32)))
        budget = draw(st.integers(1 << 20, 2 * gpu.memory_bytes))
        models.append(ElasticModel(name=f"m{i}", namespace="llm", model=f"org/m{i}", budget_bytes=budget, slo=slo,
                                   gpu_product=product, weight_dtype=weights))
    slots = tuple(GpuSlot(node=f"node-{j}", index=0, product=product, memory_bytes=gpu.memory_bytes)
                  for j in range(draw(st.integers(1, 2))))
    return Inputs(models=tuple(models), profiles=tuple(profiles), slots=slots)


CONFIGS: dict[tuple[str, str, str], dict] = {}  # (model, weight dtype, compute dtype) -> its config.json


def tensor_table(config: dict) -> dict[str, dict]:
    """The safetensors header a bfloat16 checkpoint of `config` has (names and shapes as transformers saves them)."""
    def t(*shape):
        return {"dtype": "BF16", "shape": list(shape)}

    if config["model_type"] == "gpt2":
        h, i, v = config["n_embd"], config["n_inner"], config["vocab_size"]
        table = {"transformer.wte.weight": t(v, h), "transformer.wpe.weight": t(config["n_positions"], h),
                 "transformer.ln_f.weight": t(h), "transformer.ln_f.bias": t(h)}
        for n in range(config["n_layer"]):
            at = f"transformer.h.{n}."
            table |= {at + "ln_1.weight": t(h), at + "ln_1.bias": t(h), at + "ln_2.weight": t(h), at + "ln_2.bias": t(h),
                      at + "attn.c_attn.weight": t(h, 3 * h), at + "attn.c_attn.bias": t(3 * h),
                      at + "attn.c_proj.weight": t(h, h), at + "attn.c_proj.bias": t(h),
                      at + "mlp.c_fc.weight": t(h, i), at + "mlp.c_fc.bias": t(i),
                      at + "mlp.c_proj.weight": t(i, h), at + "mlp.c_proj.bias": t(h)}
        return table
    h, i, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    d = h // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * d, config["num_key_value_heads"] * d
    table = {"model.embed_tokens.weight": t(v, h), "model.norm.weight": t(h)}
    if not config["tie_word_embeddings"]:
        table["lm_head.weight"] = t(v, h)
    for n in range(config["num_hidden_layers"]):
        at = f"model.layers.{n}."
        table |= {at + "input_layernorm.weight": t(h), at + "post_attention_layernorm.weight": t(h),
                  at + "self_attn.q_proj.weight": t(q, h), at + "self_attn.k_proj.weight": t(kv, h),
                  at + "self_attn.v_proj.weight": t(kv, h), at + "self_attn.o_proj.weight": t(h, q),
                  at + "mlp.gate_proj.weight": t(i, h), at + "mlp.up_proj.weight": t(i, h),
                  at + "mlp.down_proj.weight": t(h, i)}
        if config["model_type"] == "qwen2":
            table |= {at + "self_attn.q_proj.bias": t(q), at + "self_attn.k_proj.bias": t(kv),
                      at + "self_attn.v_proj.bias": t(kv)}
    return table


def checkpoint_of(profile) -> ModelShape:
    """The checkpoint of the profile's architecture as the worker reads it (worker.shape's own arithmetic, in the
    rendered dtype and weight dtype, on the profile's GPU): its bytes must be the profile's, byte for byte."""
    config = CONFIGS[profile.model, profile.weight_dtype, profile.dtype]
    shape = shape_from(config, tensor_table(config), profile.dtype, profile.weight_dtype,
                       CATALOG[profile.gpu_product].compute_capability)
    assert (shape.embedding_bytes, shape.layer_bytes, shape.other_bytes, shape.kv_bytes_per_token) == (
        profile.embedding_bytes, profile.layer_bytes, profile.final_norm_bytes + profile.head_bytes,
        profile.kv_bytes_per_token), profile.weight_dtype
    return shape


def rendered_config(slot: GpuSlot, entries: list[dict]):
    return parse_config({"apiVersion": API_VERSION, "kind": WORKER_CONFIG_KIND,
                         "slot": {"id": slot.id, "product": slot.product, "capacityBytes": slot.usable_bytes},
                         "models": entries})


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleets())
def test_every_placed_model_is_admitted_with_exactly_the_planned_bytes(inputs):
    result = plan(inputs)
    by_model = {m.key: m for m in inputs.models}
    profiles = {p.model: p for p in inputs.profiles}
    for slot in inputs.slots:
        placed = [d for d in result.decisions if d.slot == slot.id]
        entries = [model_entry(by_model[d.key], d) for d in placed]
        config = rendered_config(slot, entries)
        verdicts = admit([(m, checkpoint_of(profiles[m.model])) for m in config.models], slot.usable_bytes,
                         slot=slot.id)
        for decision, verdict in zip(placed, verdicts):
            assert verdict.verdict == "applied", (decision, verdict.message)
            assert verdict.need_bytes == decision.footprint_bytes, (decision.mode, verdict.message)
            if decision.mode == "elastic":
                assert verdict.resident_layers == decision.resident_layers


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleets(), st.data())
def test_the_full_need_is_the_same_number_on_both_sides_in_every_mode(inputs, data):
    """Whatever mode and resident-layer count the worker is told, its need is the footprint arithmetic of
    the planned terms: resident and swap take the decision's needBytes, elastic the slice at that count."""
    result = plan(inputs)
    decisions = [d for d in result.decisions if d.terms is not None]
    if not decisions:
        return
    decision = data.draw(st.sampled_from(decisions))
    model = next(m for m in inputs.models if m.key == decision.key)
    profile = next(p for p in inputs.profiles if p.model == model.model)
    mode = data.draw(st.sampled_from(["resident", "swap", "elastic"]))
    layers = data.draw(st.integers(0, profile.total_layers - 1))
    entry = model_entry(model, decision) | {"mode": mode, "residentLayers": layers, "budgetBytes": 1 << 62}
    slot = GpuSlot(node="n", index=0, product=profile.gpu_product, memory_bytes=1 << 62, reserved_bytes=0)
    [config] = rendered_config(slot, [entry]).models
    [verdict] = admit([(config, checkpoint_of(profile))], 1 << 62, slot=slot.id)
    expected = (cost.elastic_slice_at(profile, model.slo, layers).footprint if mode == "elastic"
                else decision.need_bytes)
    assert (verdict.verdict, verdict.need_bytes) == ("applied", expected)
