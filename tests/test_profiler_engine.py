"""The profiler measures through the worker's engine, and one KV-argument adapter serves both on 5.17 and 5.24+.

transformers 5.17 takes the cache as `past_key_values=` and returns `.past_key_values`;
5.24 and later take `cache=` and return `.cache`. A model class that speaks 5.17 is built
here by wrapping the installed release's Llama, so both branches of contract.hf_compat run
through the worker's Generation and the profiler's forward with the same weights.
"""
from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2LMHeadModel, LlamaForCausalLM

from contract.batching import buckets
from contract.hf_compat import cache_argument
from profiler_job.cli import main
from profiler_job.measure.device import Device, forward
from profiler_job.measure.engine import worker_engine
from profiler_job.measure.kv import measure_kv
from profiler_job.measure.latency import DECODE_PROMPT_TOKENS, decode_step_ms
from profiler_job.run import Adapters
from tests.tinymodels import config_for, save_tiny_model

CPU = Device("cpu")


def release_class(base: type, cache_name: str) -> type:
    """`base` as a transformers release that takes and returns the KV cache as `cache_name` (and refuses the other
    name), built on the installed release, whichever name that one uses."""
    installed, other = cache_argument(base), ({"cache", "past_key_values"} - {cache_name}).pop()

    def forward(self, input_ids=None, use_cache=None, logits_to_keep=0, **kwargs):
        if other in kwargs:
            raise TypeError(f"forward() got an unexpected keyword argument {other!r}")
        out = base.forward(self, input_ids=input_ids, use_cache=use_cache, logits_to_keep=logits_to_keep,
                           **{installed: kwargs.pop(cache_name, None)}, **kwargs)
        return SimpleNamespace(logits=out.logits, **{cache_name: getattr(out, installed)})

    parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
                  *(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None)
                    for name in ("input_ids", cache_name, "use_cache", "logits_to_keep")),
                  inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)]
    forward.__signature__ = inspect.Signature(parameters)
    return type(f"{base.__name__}As{cache_name.title().replace('_', '')}", (base,), {"forward": forward})


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models step many times faster on one intra-op thread on a shared CPU; restored after the module."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


RELEASES = {"5.17-past_key_values": "past_key_values", "5.24-cache": "cache"}
GPT2_KV_BYTES_PER_TOKEN = 2 * 4 * 4 * 16 * 4  # K and V x 4 layers x 4 heads x head dim 16 x float32


@pytest.fixture(scope="module")
def gpt2() -> GPT2LMHeadModel:
    """Takes the worker's transformers fallback forward (the one that hands transformers a cache)."""
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config_for("gpt2")).eval()


@pytest.fixture(scope="module")
def llama() -> LlamaForCausalLM:
    """Takes the worker's own batched decoder forward."""
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config_for("llama")).eval()


def as_release(reference, cache_name: str):
    model = release_class(type(reference), cache_name)(reference.config).eval()
    model.load_state_dict(reference.state_dict())
    return model


def greedy(reference, prompt: list[int], tokens: int) -> list[int]:
    ids = torch.tensor([prompt])
    out = reference.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                             pad_token_id=reference.config.pad_token_id)
    return out[0, len(prompt):].tolist()


PROMPTS = [[5, 9, 200, 14], [77, 3], [1, 2, 3, 4, 5, 6, 7]]


def decoded(model, prompts=PROMPTS, steps: int = 3) -> list[list[int]]:
    """Greedy tokens of `prompts` decoded together in one worker-engine session. The prompts span prefill
    chunks, so a sequence whose prompt is in decodes while later ones prefill: each has at least 1 + steps."""
    session = worker_engine(model, CPU, slots=len(prompts), context_tokens=32, prefill_chunk_tokens=3)
    session.prefill(prompts)
    for _ in range(steps):
        session.decode_step()
    tokens = session.outputs()
    session.close()
    assert session.outputs() == []
    return tokens


@pytest.mark.parametrize("release", RELEASES)
def test_the_adapter_reads_the_cache_argument_from_the_forward_signature(release, gpt2):
    assert cache_argument(type(as_release(gpt2, RELEASES[release]))) == RELEASES[release]


@pytest.mark.parametrize("release", RELEASES)
def test_worker_fallback_forward_decodes_like_generate_under_either_cache_argument(release, gpt2):
    tokens = decoded(as_release(gpt2, RELEASES[release]))
    assert all(len(t) >= 4 for t in tokens)
    assert tokens == [greedy(gpt2, prompt, len(t)) for prompt, t in zip(PROMPTS, tokens)]


@pytest.mark.parametrize("release", RELEASES)
def test_profiler_forward_carries_the_cache_under_either_cache_argument(release, gpt2):
    model = as_release(gpt2, RELEASES[release])
    prompt = forward(model, torch.tensor([[5, 9, 200, 14]]))
    step = forward(model, prompt.logits.argmax(dim=-1), prompt.cache)
    assert step.cache is prompt.cache and step.cache.get_seq_length() == 5
    assert measure_kv(model, CPU).bytes_per_token == GPT2_KV_BYTES_PER_TOKEN


def test_profiler_session_on_the_worker_decoder_path_decodes_like_generate(llama):
    tokens = decoded(llama)
    assert all(len(t) >= 4 for t in tokens)
    assert tokens == [greedy(llama, prompt, len(t)) for prompt, t in zip(PROMPTS, tokens)]


@pytest.mark.parametrize("concurrency,batches", [(1, [1]), (2, [1, 2]), (3, [1, 2, 3]), (6, [1, 2, 4, 6]),
                                                 (8, [1, 2, 4, 8]), (32, [1, 2, 4, 8, 16, 32])],
                         ids=lambda v: str(v))
def test_decode_is_measured_at_the_worker_graph_buckets_of_the_concurrency(concurrency, batches):
    assert buckets(concurrency) == batches


class Recording:
    """An EngineFactory around the worker's engine that records each session's slots, context, prompts and steps."""

    def __init__(self, inner=worker_engine):
        self.inner = inner
        self.sessions: list[dict] = []

    def __call__(self, model, device, *, slots, context_tokens, prefill_chunk_tokens):
        session = self.inner(model, device, slots=slots, context_tokens=context_tokens,
                             prefill_chunk_tokens=prefill_chunk_tokens)
        record = {"slots": slots, "context": context_tokens, "chunk": prefill_chunk_tokens, "prompts": [], "steps": 0}
        self.sessions.append(record)

        class Session:
            def prefill(self, prompts):
                record["prompts"].extend(len(p) for p in prompts)
                session.prefill(prompts)

            def decode_step(self):
                record["steps"] += 1
                session.decode_step()

            def outputs(self):
                return session.outputs()

            def close(self):
                session.close()
        return Session()


class FirstOnly:
    """A broken engine session: its decode step advances only the first sequence."""

    def __init__(self, *args, slots, **kwargs):
        self.tokens: list[list[int]] = []

    def prefill(self, prompts):
        self.tokens += [[0] for _ in prompts]

    def decode_step(self):
        self.tokens[0].append(0)

    def outputs(self):
        return self.tokens

    def close(self):
        self.tokens = []


def test_profile_decode_step_times_come_from_engine_sessions_at_each_batch_up_to_the_concurrency(tmp_path):
    import yaml

    model_dir = save_tiny_model(tmp_path / "llama")
    engine = Recording()
    out = tmp_path / "profile.yaml"
    code = main(["--model", str(model_dir), "--gpu-product", "NVIDIA-H200", "--context-tokens", "24",
                 "--repeats", "2", "--concurrency", "6", "--out", f"file:{out}",
                 "--termination-log", str(tmp_path / "log")],
                adapters=Adapters(cuda_available=lambda: False, engine=engine), tty=False,
                stderr=open(tmp_path / "stderr", "w"))
    assert code == 0, (tmp_path / "stderr").read_text()
    latency = yaml.safe_load(out.read_text())["latency"]

    assert [entry["batch"] for entry in latency["decodeStepMs"]] == [1, 2, 4, 6]
    assert all(entry["ms"] > 0 for entry in latency["decodeStepMs"])
    assert latency["decodeMsPerToken"] == latency["decodeStepMs"][0]["ms"]
    prefills = [s for s in engine.sessions if s["steps"] == 0]
    decodes = [s for s in engine.sessions if s["steps"]]
    # a 24-token prompt in one chunk, a slot one longer for its first token; a warm-up and 2 repeats
    assert prefills == [{"slots": 1, "context": 25, "chunk": 24, "prompts": [24], "steps": 0}] * 3
    assert [(s["slots"], s["context"], s["prompts"], s["steps"]) for s in decodes] == [
        (batch, 24, [DECODE_PROMPT_TOKENS] * batch, 3) for batch in (1, 2, 4, 6)]  # warm-up + 2 timed steps


def test_an_engine_whose_step_leaves_sequences_behind_is_refused(llama):
    with pytest.raises(RuntimeError, match="does not advance the whole batch"):
        decode_step_ms(llama, CPU, FirstOnly, concurrency=2, context_tokens=32, chunk_tokens=16, repeats=2)
