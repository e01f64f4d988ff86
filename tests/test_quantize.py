"""engine/quantize.py on CPU: int8 and int4 weights agree with the float model within the documented bounds, hold
exactly the bytes contract.footprint counts (the worker's shape, the estimator and the profiler agree), run in
every residency mode with the same tokens, and stream half (int8) or about a quarter (int4) of the bytes.

The bounds (docs/worker.md, Weight dtypes), on the tests' tiny random models, cosine similarity of the logits
at every position of a 24-token prompt against the float model's: int8 at least 0.99 at each position;
int4 at least 0.93 at each position and 0.97 on average (4 bits with groups of 64 on random weights).
"""
from __future__ import annotations

import copy
import json
import struct

import pytest
import torch
from transformers import AutoModelForCausalLM

from contract.estimate import architecture_from_config, layer_bytes, parameter_counts
from engine.batch import ModelEngine
from engine.memory import DeviceLedger
from engine.quantize import quantize_decoder
from engine.residency import make_residency
from tinymodels import config_for, save_tiny_model
from worker.shape import read_shape
from worker_support import generation, single_threaded_torch  # noqa: F401  (fixture used by name)

CPU = torch.device("cpu")
FAMILIES = ("llama", "qwen2", "gpt2")
BOUNDS = {"int8": (0.99, 0.99), "int4": (0.93, 0.97)}  # (each position, mean)


def model_of(family: str, dtype: torch.dtype = torch.float32):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config_for(family), dtype=dtype).eval()


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_logits_agree_with_the_float_model_within_the_bound(family, dtype, weights):
    model = model_of(family, dtype)
    ids = torch.randint(0, 250, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        reference = model(ids).logits.float()
    quantized = copy.deepcopy(model)
    count = quantize_decoder(quantized, weights, CPU)
    assert count == 4 * (4 if family == "gpt2" else 7)  # every linear of every decoder layer
    assert isinstance(quantized.lm_head, torch.nn.Linear)  # the head stays in the compute dtype
    with torch.no_grad():
        out = quantized(ids).logits.float()
    cosine = torch.nn.functional.cosine_similarity(out.flatten(0, 1), reference.flatten(0, 1), dim=-1)
    each, mean = BOUNDS[weights]
    assert cosine.min().item() >= each and cosine.mean().item() >= mean, (cosine.min().item(), cosine.mean().item())


def _header(directory) -> dict:
    raw = (directory / "model.safetensors").read_bytes()
    return json.loads(raw[8: 8 + struct.unpack("<Q", raw[:8])[0]])


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_the_engine_holds_exactly_the_bytes_the_worker_and_the_estimator_count(family, weights, tmp_path):
    """One arithmetic: the quantized model's decoder-layer tensors (what residency packs and streams) are the
    bytes worker.shape reads from the checkpoint's header and contract.estimate counts from its architecture."""
    directory = save_tiny_model(tmp_path / family, family)
    model = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True).eval()
    quantize_decoder(model, weights, CPU)
    held = [sum(t.numel() * t.element_size() for t in layer.state_dict().values())
            for layer in (model.transformer.h if family == "gpt2" else model.model.layers)]
    shape = read_shape(directory, "auto", weights)
    arch = architecture_from_config(json.loads((directory / "config.json").read_text()))
    assert list(shape.layer_bytes) == held
    assert held == [layer_bytes(parameter_counts(arch), "float32", weights)] * 4
    assert shape.weights == weights and shape.dtype == "float32"


@pytest.mark.parametrize("weights", ["int8", "int4"])
@pytest.mark.parametrize("family", ["llama", "gpt2"])  # the engine's own decoder forward, and transformers'
def test_resident_swap_and_elastic_answer_the_same_tokens(family, weights, tmp_path):
    directory = save_tiny_model(tmp_path / family, family)
    answers = {}
    for mode, layers in (("resident", None), ("swap", None), ("elastic", 1), ("elastic", 0)):
        model = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True).eval()
        quantize_decoder(model, weights, CPU)
        residency = make_residency(mode, model, DeviceLedger("m", 1 << 30, CPU), CPU, resident_layers=layers)
        residency.load()
        residency.activate()
        engine = ModelEngine(residency, concurrency=1, context_tokens=64, kv_bytes=0)
        sequence = generation(tokens=8)
        engine.join(sequence)
        while engine.seated:
            engine.step()
        answers[mode, layers] = tuple(sequence.output_ids)
        if mode == "elastic":  # the streamed layers' quantized weights are back in host memory between passes
            assert residency.device_resident_layers() == list(range(layers))
    assert len(set(answers.values())) == 1, answers


def _streamed_per_pass(model) -> int:
    residency = make_residency("elastic", model, DeviceLedger("m", 1 << 30, CPU), CPU, resident_layers=0)
    streamed = []
    residency.on_streamed_bytes = streamed.append
    residency.load()
    engine = ModelEngine(residency, concurrency=1, context_tokens=64, kv_bytes=0)
    engine.join(generation(tokens=3))
    engine.step()  # the prefill: one pass
    before = sum(streamed)
    engine.step()  # one decode step: one more pass over the streamed layers
    return sum(streamed) - before


def test_elastic_streaming_in_int8_moves_half_the_bytes_of_bfloat16_and_int4_about_a_quarter():
    reference = _streamed_per_pass(model_of("llama", torch.bfloat16))
    ratios = {}
    for weights in ("int8", "int4"):
        model = model_of("llama", torch.bfloat16)
        quantize_decoder(model, weights, CPU)
        ratios[weights] = _streamed_per_pass(model) / reference
    # norms and per-channel scales stay in bfloat16; int4 adds a scale and a zero per 64 weights
    assert 0.5 <= ratios["int8"] <= 0.52 and 0.25 <= ratios["int4"] <= 0.31, ratios
