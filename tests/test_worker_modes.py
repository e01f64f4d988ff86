"""Residency modes on CPU: same greedy tokens in resident, swap and elastic for three families;
elastic keeps exactly its resident layers and prefetches one layer ahead into two buffers;
device-byte accounting never passes a model's budget."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from transformers import AutoModelForCausalLM

from contract.footprint import PREFILL_CHUNK_TOKENS, footprint
from engine.batch import Generation, ModelEngine
from engine.text import TextStream
from engine.sampling import Choice, SamplingParams
from engine.errors import BudgetExceeded
from engine.memory import DeviceLedger
from engine.residency import decoder_layers, make_residency
from engine.residency.elastic import ElasticResidency
from engine.transfer import Transfer
from worker.shape import estimated_terms, read_shape
from worker_support import FAMILIES, MiB, single_threaded_torch, tiny_models  # noqa: F401  (fixtures)

CPU = torch.device("cpu")
PROMPT = [72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 33, 10, 5, 6, 7, 8, 9, 10, 11]


def loaded(path, mode, *, budget=64 * MiB, resident_layers=None, transfer=None):
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()
    ledger = DeviceLedger(path.name, budget, CPU)
    if transfer is not None:
        residency = ElasticResidency(model, ledger, CPU, pin=False, resident_layers=resident_layers,
                                     transfer=transfer)
    else:
        residency = make_residency(mode, model, ledger, CPU, resident_layers=resident_layers)
    residency.load()
    residency.activate()
    return residency


def alone(residency, generation, *, prefill_chunk=8, context=64) -> list[int]:
    """Run one generation by itself through a ModelEngine over `residency`."""
    engine = ModelEngine(residency, concurrency=1, context_tokens=context, kv_bytes=0, prefill_chunk=prefill_chunk)
    engine.join(generation)
    while not generation.done:
        engine.step()
    return generation.output_ids


def greedy(residency, *, max_tokens=12, prefill_chunk=8, prompt=PROMPT) -> list[int]:
    generation = Generation(prompt_ids=list(prompt), params=SamplingParams(max_tokens=max_tokens, temperature=0),
                            eos_ids=frozenset(), decode=lambda ids: "")
    return alone(residency, generation, prefill_chunk=prefill_chunk)


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_tokens_are_identical_in_every_mode(tiny_models, family):
    path = tiny_models[family]
    reference = AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()
    expected = reference.generate(torch.tensor([PROMPT]), max_new_tokens=12, do_sample=False,
                                  eos_token_id=None)[0, len(PROMPT):].tolist()
    got = {
        "resident": greedy(loaded(path, "resident")),
        "swap": greedy(loaded(path, "swap")),
        "elastic-0": greedy(loaded(path, "elastic", resident_layers=0)),
        "elastic-2": greedy(loaded(path, "elastic", resident_layers=2)),
        "elastic-3": greedy(loaded(path, "elastic", resident_layers=3)),
    }
    assert got == {mode: expected for mode in got}, f"{family}: modes disagree with transformers generate"


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_elastic_prefill_in_streaming_floor_chunks_matches_transformers(tiny_models, family):
    """The chunk the footprint sizes to the streaming floor (above the fixed one), several of them per prompt:
    the same greedy tokens as transformers, in exactly ceil(prompt ÷ chunk) prefill steps."""
    path = tiny_models[family]
    prompt = [(7 * i + 3) % 250 for i in range(1400)]
    context = len(prompt) + 8
    terms = estimated_terms(read_shape(path))
    terms = replace(terms, stream_bytes_per_prefill_token=sum(terms.layer_bytes[1:]) // 600)
    need = footprint(terms, context, 1, resident_layers=1)
    chunk = need.prefill_chunk_tokens
    assert PREFILL_CHUNK_TOKENS < chunk < len(prompt) // 2, "the floor chunk is above the fixed one, several run"
    reference = AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()
    expected = reference.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False,
                                  eos_token_id=None)[0, len(prompt):].tolist()
    engine = ModelEngine(loaded(path, "elastic", resident_layers=1), concurrency=1, context_tokens=context,
                         kv_bytes=0, prefill_chunk=chunk)
    generation = Generation(prompt_ids=prompt, params=SamplingParams(max_tokens=6, temperature=0),
                            eos_ids=frozenset(), decode=lambda ids: "")
    engine.join(generation)
    prefill_steps = 0
    while generation.prefilling:
        engine.step()
        prefill_steps += 1
    while not generation.done:
        engine.step()
    assert (generation.output_ids, prefill_steps) == (expected, -(-len(prompt) // chunk)), family


@pytest.mark.parametrize("resident_layers", [0, 1, 3, 4])
def test_elastic_keeps_exactly_its_resident_layers_on_the_device(tiny_models, resident_layers):
    residency = loaded(tiny_models["llama"], "elastic", resident_layers=resident_layers)
    assert residency.device_resident_layers() == list(range(resident_layers))
    greedy(residency, max_tokens=3)
    assert residency.device_resident_layers() == list(range(resident_layers)), "a forward pass left layers behind"
    streamed = 4 - resident_layers
    assert len(residency.buffers) == (2 if streamed else 0)


def test_elastic_device_bytes_are_resident_slice_plus_two_layer_buffers(tiny_models):
    residency = loaded(tiny_models["llama"], "elastic", resident_layers=1)
    layers = decoder_layers(residency.model)
    layer_bytes = sum(p.numel() * p.element_size() for p in layers[0].parameters())
    all_bytes = sum(p.numel() * p.element_size() for p in residency.model.parameters()) + sum(
        b.numel() * b.element_size() for b in residency.model.buffers())
    buffer_bytes = sum(b.numel() for b in residency.buffers)
    assert residency.ledger.placed_bytes == all_bytes - 3 * layer_bytes + buffer_bytes
    assert layer_bytes <= residency.buffers[0].numel() < layer_bytes + 64 * 16, "a buffer holds one aligned layer"


class RecordingTransfer(Transfer):
    """The CPU transfer, logging each copy, each compute wait and each buffer release in order."""

    def __init__(self):
        super().__init__(CPU)
        self.log: list[tuple[str, str]] = []

    def copy(self, dst, src, *, after, done):
        self.log.append(("copy", f"{done.label} after {after.label}"))
        super().copy(dst, src, after=after, done=done)

    def compute_waits_for(self, event):
        self.log.append(("wait", event.label))

    def compute_marks(self, event):
        self.log.append(("mark", event.label))


def test_elastic_prefetches_one_layer_ahead_into_alternating_buffers(tiny_models):
    transfer = RecordingTransfer()
    residency = loaded(tiny_models["llama"], "elastic", resident_layers=1, transfer=transfer)
    transfer.log.clear()
    with torch.inference_mode():
        residency.model(input_ids=torch.tensor([PROMPT[:4]]))
    assert transfer.log == [
        ("copy", "copied:1 after free:init"),  # starts with the model, before embeddings and layer 0
        ("wait", "copied:1"), ("copy", "copied:2 after free:init"), ("mark", "free:1"),
        ("wait", "copied:2"), ("copy", "copied:3 after free:1"), ("mark", "free:2"),  # buffer 1 reused after 1
        ("wait", "copied:3"), ("mark", "free:3"),
        ("copy", "copied:1 after free:3"),  # the next pass's first layer, as soon as buffer 0 is free
    ]
    transfer.log.clear()
    with torch.inference_mode():
        residency.model(input_ids=torch.tensor([PROMPT[:4]]))
    assert transfer.log[:2] == [("wait", "copied:1"), ("copy", "copied:2 after free:2")], \
        "the second pass starts on the layer copied ahead, with no copy of its own at its start"


def test_elastic_streams_every_non_resident_layer_once_per_forward_pass(tiny_models):
    residency = loaded(tiny_models["qwen2"], "elastic", resident_layers=1)
    streamed: list[int] = []
    residency.on_streamed_bytes = streamed.append
    greedy(residency, max_tokens=2, prefill_chunk=64)  # one prefill pass + one decode pass
    per_pass = [layer.host.numel() for layer in residency.streamed]
    assert streamed == per_pass * 2 + per_pass[:1], "each pass once, and the next pass's first layer ahead"


@pytest.mark.parametrize("mode,resident_layers", [("resident", None), ("swap", None), ("elastic", 1)])
def test_device_bytes_never_exceed_the_budget(tiny_models, mode, resident_layers):
    residency = loaded(tiny_models["gpt2"], mode, budget=4 * MiB, resident_layers=resident_layers)
    engine = ModelEngine(residency, concurrency=1, context_tokens=64, kv_bytes=1 * MiB)
    generation = Generation(prompt_ids=list(PROMPT), params=SamplingParams(max_tokens=4, temperature=0),
                            eos_ids=frozenset(), decode=lambda ids: "")
    engine.join(generation)
    while not generation.done:
        engine.step()
    assert residency.ledger.peak_bytes <= residency.ledger.budget_bytes
    with pytest.raises(BudgetExceeded) as refused:
        loaded(tiny_models["gpt2"], mode, budget=residency.ledger.placed_bytes // 2, resident_layers=resident_layers)
    assert refused.value.reason == "BudgetExceeded" and "raise memoryBudget" in refused.value.message


def test_swap_out_drops_the_device_copy_and_swap_in_restores_the_same_answers(tiny_models):
    residency = loaded(tiny_models["llama"], "swap")
    before = greedy(residency)
    assert residency.ledger.placed_bytes > 0 and len(residency.device_resident_layers()) == 4
    residency.deactivate()
    assert residency.ledger.placed_bytes == 0 and residency.device_resident_layers() == []
    assert not residency.on_device
    residency.activate()
    assert greedy(residency) == before


@pytest.mark.parametrize("case,params,expect", [
    ("same-seed-same-tokens", dict(temperature=1.0, seed=7), "equal"),
    ("top-p-tiny-is-greedy", dict(temperature=1.0, top_p=1e-6, seed=3), "greedy"),
])
def test_sampling(tiny_models, case, params, expect):
    residency = loaded(tiny_models["llama"], "resident")

    def run(**p):
        return alone(residency, Generation(prompt_ids=list(PROMPT), params=SamplingParams(max_tokens=10, **p),
                                           eos_ids=frozenset(), decode=lambda ids: ""))

    if expect == "equal":
        assert run(**params) == run(**params), case
    else:
        assert run(**params) == greedy(residency, max_tokens=10, prefill_chunk=512), case


@pytest.mark.parametrize("case,stop,eos,finish,text", [
    ("max-tokens", (), frozenset(), "length", "abcdef"),
    ("stop-string-cut", ("cd",), frozenset(), "stop", "ab"),
    ("stop-string-never-leaks-a-prefix", ("cx",), frozenset(), "length", "abcdef"),
    ("eos-token", (), frozenset({ord("d")}), "stop", "abc"),
])
def test_generation_stops(case, stop, eos, finish, text):
    """Scripted tokens, the bytes of 'abcdef' in order: the engine's Generation decides the token stops, the
    consumer's TextStream the stop strings (what follows a stop string is dropped)."""
    generation = Generation(prompt_ids=[1, 2], params=SamplingParams(max_tokens=6, temperature=0, stop=stop),
                            eos_ids=eos, decode=lambda ids: bytes(ids).decode())
    stream = TextStream(generation.decode, generation.params.stop)
    pieces = []
    for letter in "abcdef":
        if generation.done:
            break
        held = len(generation.output_ids)
        generation.accept(Choice(ord(letter)))
        pieces.append(stream.feed(generation.output_ids[held:], generation.done))
    reason = "stop" if stream.stopped else generation.finish_reason
    assert ("".join(p for p in pieces if p), reason) == (text, finish), case


def test_text_is_never_emitted_inside_a_utf8_sequence_and_long_outputs_decode_incrementally():
    seen = []

    def decode(ids):
        seen.append(len(ids))
        return bytes(ids).decode(errors="replace")

    stream = TextStream(decode)
    script = list("é".encode()) + [ord("x")] + [ord("y")] * 297
    pieces = [stream.feed([token], done=False) for token in script]
    assert pieces[:3] == ["", "é", "x"] and "".join(pieces) == "éx" + "y" * 297
    assert max(seen) <= 4, "each step decodes a few tokens of context, not the whole output"
    assert len(seen) < 1.5 * len(script), "about one decode per token, not two"


@pytest.mark.parametrize("case,stop,script,pieces,tokens", [
    ("stop-inside-one-token", ("c",), [b"ab", b"cd", b"ef"], ["ab", ""], 2),
    ("stop-across-tokens", ("bc",), [b"a", b"b", b"c", b"d"], ["", "a", ""], 3),
    ("later-tokens-dropped", ("b",), [b"a", b"b", b"c"], ["a", ""], 2),
    ("held-prefix-released-at-the-end", ("xy",), [b"a", b"x"], ["", "ax"], 2),
])
def test_a_stop_string_ends_the_text_and_counts_the_tokens_up_to_it(case, stop, script, pieces, tokens):
    """Tokens are byte strings here (one id each); the last feed is `done`, as an answer's last token."""
    vocabulary = {i: piece for i, piece in enumerate(script)}
    stream = TextStream(lambda ids: b"".join(vocabulary[i] for i in ids).decode(), stop)
    got = [stream.feed([i], done=i == len(script) - 1) for i in range(len(script)) if not stream.stopped]
    assert (got, stream.tokens) == (pieces, tokens), case
