"""The profiler measures through the worker's engine, and one KV-argument adapter serves both on 5.17 and 5.24+.

transformers 5.17 takes the cache as `past_key_values=` and returns `.past_key_values`;
5.24 and later take `cache=` and return `.cache`. A model class that speaks 5.17 is built
here by wrapping the installed release's Llama, so both branches of contract.hf_compat run
through the worker's Generation and the profiler's forward with the same weights.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaForCausalLM

from contract.hf_compat import cache_argument
from profiler_job.cli import main
from profiler_job.measure.device import Device, forward
from profiler_job.measure.engine import worker_engine
from profiler_job.measure.kv import measure_kv
from profiler_job.measure.latency import DECODE_PROMPT_TOKENS, decode_batches, decode_step_ms
from profiler_job.run import Adapters
from tests.tinymodels import config_for, save_tiny_model

CPU = Device("cpu")


class Release517Llama(LlamaForCausalLM):
    """transformers 5.17's calling convention: the cache is `past_key_values=` in and `.past_key_values` out."""

    def forward(self, input_ids=None, past_key_values=None, use_cache=None, logits_to_keep=0, **kwargs):
        if "cache" in kwargs:
            raise TypeError("forward() got an unexpected keyword argument 'cache' (transformers 5.17)")
        out = super().forward(input_ids=input_ids, use_cache=use_cache, logits_to_keep=logits_to_keep,
                              **{cache_argument(LlamaForCausalLM): past_key_values}, **kwargs)
        return SimpleNamespace(logits=out.logits, past_key_values=getattr(out, cache_argument(LlamaForCausalLM)))


class Release524Llama(LlamaForCausalLM):
    """transformers 5.24's calling convention: `cache=` in, `.cache` out."""

    def forward(self, input_ids=None, cache=None, use_cache=None, logits_to_keep=0, **kwargs):
        if "past_key_values" in kwargs:
            raise TypeError("forward() got an unexpected keyword argument 'past_key_values' (transformers 5.24)")
        out = super().forward(input_ids=input_ids, use_cache=use_cache, logits_to_keep=logits_to_keep,
                              **{cache_argument(LlamaForCausalLM): cache}, **kwargs)
        return SimpleNamespace(logits=out.logits, cache=getattr(out, cache_argument(LlamaForCausalLM)))


RELEASES = {"5.17-past_key_values": (Release517Llama, "past_key_values"), "5.24-cache": (Release524Llama, "cache")}


@pytest.fixture(scope="module")
def reference() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config_for("llama")).eval()


def as_release(model_class: type, reference) -> LlamaForCausalLM:
    model = model_class(reference.config).eval()
    model.load_state_dict(reference.state_dict())
    return model


def greedy(reference, prompt: list[int], tokens: int) -> list[int]:
    ids = torch.tensor([prompt])
    out = reference.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("release", RELEASES)
def test_the_adapter_reads_the_cache_argument_from_the_forward_signature(release):
    model_class, name = RELEASES[release]
    assert cache_argument(model_class) == name


@pytest.mark.parametrize("release", RELEASES)
def test_worker_engine_decodes_like_generate_under_either_cache_argument(release, reference):
    model = as_release(RELEASES[release][0], reference)
    prompts = [[5, 9, 200, 14], [77, 3], [1, 2, 3, 4, 5, 6, 7]]
    session = worker_engine(model, CPU, slots=3, prefill_chunk_tokens=3)  # a prompt spans several chunks
    session.prefill(prompts)
    for _ in range(3):
        session.decode_step()
    assert session.outputs() == [greedy(reference, prompt, 4) for prompt in prompts]
    session.close()
    assert session.outputs() == []


@pytest.mark.parametrize("release", RELEASES)
def test_profiler_forward_carries_the_cache_under_either_cache_argument(release, reference):
    model = as_release(RELEASES[release][0], reference)
    prompt = forward(model, torch.tensor([[5, 9, 200, 14]]))
    step = forward(model, prompt.logits.argmax(dim=-1), prompt.cache)
    assert step.cache is prompt.cache and step.cache.get_seq_length() == 5
    assert measure_kv(model, CPU).bytes_per_token == 2 * 4 * 2 * 16 * 4


@pytest.mark.parametrize("concurrency,batches", [(1, (1,)), (2, (1, 2)), (3, (1, 2, 3)), (6, (1, 2, 4, 6)),
                                                 (8, (1, 2, 4, 8)), (32, (1, 2, 4, 8, 16, 32))],
                         ids=lambda v: str(v))
def test_decode_is_measured_at_1_the_powers_of_two_below_and_the_concurrency(concurrency, batches):
    assert decode_batches(concurrency) == batches


class Recording:
    """An EngineFactory around the worker's engine that records each session's slots, prompts and steps."""

    def __init__(self, inner=worker_engine, skip_all_but_first: bool = False):
        self.inner, self.skip = inner, skip_all_but_first
        self.sessions: list[dict] = []

    def __call__(self, model, device, *, slots, prefill_chunk_tokens):
        session = self.inner(model, device, slots=slots, prefill_chunk_tokens=prefill_chunk_tokens)
        record = {"slots": slots, "prompts": [], "steps": 0, "chunk": prefill_chunk_tokens}
        self.sessions.append(record)
        recording = self

        class Session:
            def prefill(self, prompts):
                record["prompts"].extend(len(p) for p in prompts)
                session.prefill(prompts)

            def decode_step(self):
                record["steps"] += 1
                if recording.skip:  # a broken engine: only the first sequence advances
                    session._running[0].step(model, torch.device("cpu"))
                else:
                    session.decode_step()

            def outputs(self):
                return session.outputs()

            def close(self):
                session.close()
        return Session()


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
    assert prefills == [{"slots": 1, "prompts": [24], "steps": 0, "chunk": 24}] * 3  # warm-up + 2 repeats
    assert [(s["slots"], s["prompts"], s["steps"]) for s in decodes] == [
        (batch, [DECODE_PROMPT_TOKENS] * batch, 3) for batch in (1, 2, 4, 6)]  # warm-up + 2 timed steps


def test_an_engine_whose_step_leaves_sequences_behind_is_refused(reference):
    with pytest.raises(RuntimeError, match="does not advance the whole batch"):
        decode_step_ms(reference, CPU, Recording(skip_all_but_first=True), concurrency=2, chunk_tokens=16, repeats=2)
