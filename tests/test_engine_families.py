"""The engine's own forward for the families added to it (Qwen3's q/k norms, sliding-window attention for
Mistral and Qwen2/Qwen3) gives transformers' greedy tokens, alone and batched, resident and elastic, with
prompts longer than the window and prefill chunks that cross it; and the operators per decoder layer of
a decode step stay within the budget."""
from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM, MistralConfig, Qwen2Config, Qwen3Config

from engine.batch import Generation, ModelEngine
from engine.forward import forward_path
from engine.memory import DeviceLedger
from engine.residency import make_residency
from engine.sampling import SamplingParams
from worker_support import MiB, single_threaded_torch  # noqa: F401  (fixture)

CPU = torch.device("cpu")
SHAPE = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=256, eos_token_id=None, pad_token_id=None)
CONFIGS = {
    "qwen3": lambda layers: Qwen3Config(num_hidden_layers=layers, head_dim=16, **SHAPE),
    "mistral-window-6": lambda layers: MistralConfig(num_hidden_layers=layers, sliding_window=6, **SHAPE),
    "qwen2-window-6-from-layer-1": lambda layers: Qwen2Config(num_hidden_layers=layers, use_sliding_window=True,
                                                              sliding_window=6, max_window_layers=1, **SHAPE),
    "qwen3-window-5": lambda layers: Qwen3Config(num_hidden_layers=layers, head_dim=16, use_sliding_window=True,
                                                 sliding_window=5, max_window_layers=0, **SHAPE),
}
PROMPTS = [list(range(3, 23)), [7, 8, 9]]


def model_of(family: str, layers: int = 3):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(CONFIGS[family](layers), dtype=torch.float32,
                                            attn_implementation="eager").eval()


def reference_tokens(model, prompt, n=10) -> list[int]:
    return model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None,
                          pad_token_id=0)[0, len(prompt):].tolist()


def engine_tokens(model, mode, layers, prompts, n=10) -> list[list[int]]:
    residency = make_residency(mode, model, DeviceLedger("m", 64 * MiB, CPU), CPU, resident_layers=layers)
    residency.load()
    engine = ModelEngine(residency, concurrency=len(prompts), context_tokens=64, kv_bytes=0, prefill_chunk=8)
    assert engine.path == "decoder"
    batch = [Generation(prompt_ids=list(p), params=SamplingParams(max_tokens=n, temperature=0),
                        eos_ids=frozenset(), decode=lambda ids: "") for p in prompts]
    for generation in batch:
        engine.join(generation)
    while engine.seated:
        engine.step()
    return [g.output_ids for g in batch]


@pytest.mark.parametrize("mode,layers", [("resident", None), ("elastic", 1)])
@pytest.mark.parametrize("family", list(CONFIGS))
def test_the_engine_gives_transformers_greedy_tokens(family, mode, layers):
    model = model_of(family)
    expected = [reference_tokens(model, p) for p in PROMPTS]
    assert engine_tokens(copy.deepcopy(model), mode, layers, PROMPTS[:1]) == expected[:1], f"{family} alone"
    assert engine_tokens(copy.deepcopy(model), mode, layers, PROMPTS) == expected, f"{family} batched"


@pytest.mark.parametrize("family", list(CONFIGS))
def test_the_new_families_take_the_batching_forward(family):
    model = model_of(family, layers=1)
    residency = make_residency("resident", model, DeviceLedger("m", 64 * MiB, CPU), CPU)
    assert forward_path(residency) == ("decoder", None)


@pytest.mark.gpu
def test_seeded_sampling_gives_the_same_tokens_on_cuda_as_on_cpu():
    """The noise is an integer hash of (seed, step, token): a seeded row samples the same token on any device."""
    from engine.sampling import BatchSampler

    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 1000, generator=generator) * 3
    fields = [dict(temperature=1.0), dict(temperature=0.7, top_p=0.9), dict(temperature=1.2, top_k=20)]

    def tokens(device):
        rows = [Generation(prompt_ids=[1], params=SamplingParams(max_tokens=4, seed=i, **fields[i % 3]),
                           eos_ids=frozenset(), decode=lambda ids: "") for i in range(64)]
        return [c.token for c in BatchSampler().choose(logits.to(device), rows)]

    assert tokens(torch.device("cuda")) == tokens(CPU)


@pytest.mark.gpu
def test_graphs_are_captured_at_load_without_a_device_wide_sync(monkeypatch):
    """Capture before ready: the model's graphs exist once its engine is built, and no capture synchronized
    the device or emptied the allocator's cache (other models keep serving meanwhile)."""
    cuda = torch.device("cuda")
    model = model_of("qwen3")
    residency = make_residency("resident", model, DeviceLedger("m", 256 * MiB, cuda), cuda)
    residency.load()

    def forbidden(*args, **kwargs):
        raise AssertionError("a device-wide synchronize or cache flush during capture")

    monkeypatch.setattr(torch.cuda, "synchronize", forbidden)
    monkeypatch.setattr(torch.cuda, "empty_cache", forbidden)
    engine = ModelEngine(residency, concurrency=2, context_tokens=64, kv_bytes=0, prefill_chunk=8)
    assert sorted(engine.forward.graphs) == [(b, n) for b in (1, 2) for n in (32, 64)]
    monkeypatch.undo()

    def decoded(engine) -> list[int]:
        generation = Generation(prompt_ids=PROMPTS[0], params=SamplingParams(max_tokens=10, temperature=0),
                                eos_ids=frozenset(), decode=lambda ids: "")
        engine.join(generation)
        while engine.seated:
            engine.step()
        return generation.output_ids

    eager = ModelEngine(residency, concurrency=2, context_tokens=64, kv_bytes=0, prefill_chunk=8, graphs=False)
    assert decoded(engine) == decoded(eager)
