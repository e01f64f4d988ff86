"""The batched engine on CPU (fp32 tiny models): a batch gives every sequence the greedy tokens it
gets alone, in every mode and family, also when sequences join and leave mid-batch; a long prompt
is prefilled in chunks while the running sequences keep decoding; the KV slots are the admitted
reservation, allocated through the ledger, and a full batch stays within the budget; elastic
streams each layer once per step whatever the batch size."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from worker.admission import need_for
from worker.config import ModelConfig
from engine.batch import Generation, ModelEngine
from engine.memory import DeviceLedger
from engine.residency import make_residency
from engine.sampling import SamplingParams
from worker.shape import read_shape
from worker_support import FAMILIES, MiB, single_threaded_torch, tiny_models  # noqa: F401  (fixtures)

CPU = torch.device("cpu")
PROMPTS = [list(range(40, 61)), [72, 105, 33], list(range(100, 113)), [7] * 30]
MODES = [("resident", None), ("swap", None), ("elastic", 0), ("elastic", 2)]


def residency_of(path, mode, layers, *, budget=64 * MiB):
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()
    residency = make_residency(mode, model, DeviceLedger(path.name, budget, CPU), CPU, resident_layers=layers)
    residency.load()
    return residency


def engine_of(residency, *, concurrency, context=96, chunk=8, kv_bytes=1 * MiB):
    engine = ModelEngine(residency, concurrency=concurrency, context_tokens=context, kv_bytes=kv_bytes,
                         prefill_chunk=chunk)
    if residency.mode == "swap":
        engine.activate()
    return engine


def greedy(prompt, tokens=10) -> Generation:
    return Generation(prompt_ids=list(prompt), params=SamplingParams(max_tokens=tokens, temperature=0),
                      eos_ids=frozenset(), decode=lambda ids: "")


def run(engine, arrivals: dict[int, list[Generation]]) -> None:
    """Step until every generation finished; arrivals[k] join before step k."""
    pending = dict(arrivals)
    for step in range(1000):
        for generation in pending.pop(step, []):
            engine.join(generation)
        if not engine.seated and not pending:
            return
        engine.step()
    raise AssertionError("the batch did not finish in 1000 steps")


@pytest.mark.parametrize("mode,layers", MODES, ids=[f"{m}-{n}" if n is not None else m for m, n in MODES])
@pytest.mark.parametrize("family", FAMILIES)
def test_a_batch_gives_each_sequence_its_tokens_alone(tiny_models, family, mode, layers):
    residency = residency_of(tiny_models[family], mode, layers)
    alone = []
    for prompt in PROMPTS:
        generation = greedy(prompt)
        run(engine_of(residency, concurrency=1), {0: [generation]})
        alone.append(generation.output_ids)
    batch = [greedy(p) for p in PROMPTS]
    run(engine_of(residency, concurrency=len(PROMPTS)), {0: batch})
    assert [g.output_ids for g in batch] == alone, f"{family} {mode}: batched tokens differ from alone"


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
def test_sequences_joining_and_leaving_mid_batch_get_their_tokens_alone(tiny_models, family):
    residency = residency_of(tiny_models[family], "resident", None)
    lengths = [4, 12, 7, 9, 5]
    alone = []
    for prompt, tokens in zip(PROMPTS + [[1, 2, 3]], lengths):
        generation = greedy(prompt, tokens)
        run(engine_of(residency, concurrency=1), {0: [generation]})
        alone.append(generation.output_ids)
    joined = [greedy(p, t) for p, t in zip(PROMPTS + [[1, 2, 3]], lengths)]
    engine = engine_of(residency, concurrency=3)
    moves = []
    forward_move = engine.forward.move
    engine.forward.move = lambda src, dst, n: (moves.append((src, dst)), forward_move(src, dst, n))
    # 0 and 1 start together, 2 joins mid-decode, 0 leaves first (its slot is refilled), 3 and 4 join later
    run(engine, {0: joined[:2], 3: [joined[2]], 7: [joined[3]], 12: [joined[4]]})
    assert [g.output_ids for g in joined] == alone
    assert moves, "a sequence left from below the last slot: compaction moved the last one into its slot"


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_prompts_of_different_lengths_prefill_together_in_one_step(tiny_models, family):
    """A chunk large enough for every prompt: one step prefills all four rows (padded to the longest, each
    against its own slot), and each gets its tokens alone."""
    residency = residency_of(tiny_models[family], "resident", None)
    alone = []
    for prompt in PROMPTS:
        generation = greedy(prompt)
        run(engine_of(residency, concurrency=1, chunk=80), {0: [generation]})
        alone.append(generation.output_ids)
    batch = [greedy(p) for p in PROMPTS]
    engine = engine_of(residency, concurrency=len(PROMPTS), chunk=80)
    for generation in batch:
        engine.join(generation)
    engine.step()
    assert all(g.output_ids for g in batch), "every prompt was prefilled in the first step"
    run(engine, {})
    assert [g.output_ids for g in batch] == alone


def test_a_long_prompt_is_prefilled_in_chunks_while_running_sequences_decode(tiny_models):
    residency = residency_of(tiny_models["llama"], "resident", None)
    engine = engine_of(residency, concurrency=2, chunk=8)
    runner = greedy(PROMPTS[1], tokens=20)
    engine.join(runner)
    engine.step()  # runner's prompt (3 tokens) in one chunk: first token
    long = greedy(list(range(1, 61)), tokens=2)  # 60 tokens: 8 steps of at most 8 - 1 prompt tokens
    engine.join(long)
    steps = 0
    while long.prefilling:
        before = len(runner.output_ids)
        results = dict(engine.step())
        steps += 1
        assert len(runner.output_ids) == before + 1, "the running sequence got no token during the prefill"
        assert results[long] is None or not long.prefilling
    assert steps == -(-60 // 7), "each step spends the chunk minus the decoding rows on the prompt"


def test_a_step_never_runs_more_tokens_than_one_prefill_chunk(tiny_models):
    residency = residency_of(tiny_models["llama"], "resident", None)
    engine = engine_of(residency, concurrency=4, chunk=16)
    seen = []
    forward_run = engine.forward.run
    engine.forward.run = lambda rows: (seen.append(sum(len(r.tokens) for r in rows)), forward_run(rows))[1]
    run(engine, {0: [greedy(p, 6) for p in PROMPTS]})
    assert max(seen) <= 16 and sum(seen) == sum(len(p) for p in PROMPTS) + 4 * 5


@pytest.mark.parametrize("family,path", [("llama", "decoder"), ("qwen2", "decoder"), ("gpt2", "transformers")])
def test_forward_path_by_architecture(tiny_models, family, path):
    assert engine_of(residency_of(tiny_models[family], "resident", None), concurrency=1).path == path


@pytest.mark.parametrize("mode,layers", [("resident", None), ("swap", None), ("elastic", 1)])
def test_kv_slots_are_the_admitted_reservation_and_a_full_batch_stays_within_the_budget(tiny_models, mode, layers):
    path = tiny_models["qwen2"]
    shape = read_shape(path)
    config = ModelConfig(name="m", namespace="llm", model=str(path), mode=mode, budget_bytes=1 << 40,
                         context_tokens=64, concurrency=4, resident_layers=layers)
    need = need_for(config, shape)
    # the rotary tables are buffers the checkpoint does not store, so the footprint does not count them
    rope = 2 * 4 * (shape.hidden_size // shape.num_attention_heads // 2)
    residency = residency_of(path, mode, layers, budget=need.total + rope)
    residency.ledger.reserve("activation", need.activation)
    residency.ledger.reserve("overhead", need.overhead)
    before = residency.ledger.placed_bytes if mode != "swap" else 0
    engine = engine_of(residency, concurrency=4, context=64, chunk=16, kv_bytes=need.kv_cache)
    weights = residency.ledger.placed_bytes - (before if mode != "swap" else 0)
    assert engine.forward.kv.nbytes == need.kv_cache, "KV slots = contextTokens x concurrency x bytes per token"
    run(engine, {0: [greedy(list(range(1, 40 + i)), 64 - 40 - i) for i in range(4)]})
    assert weights > 0 and residency.ledger.peak_bytes <= residency.ledger.budget_bytes == need.total + rope


def test_elastic_streams_each_layer_once_per_step_whatever_the_batch(tiny_models):
    residency = residency_of(tiny_models["llama"], "elastic", 1)
    streamed = []
    residency.on_streamed_bytes = streamed.append
    engine = engine_of(residency, concurrency=4, chunk=128)  # 67 prompt tokens: one prefill step
    batch = [greedy(p, 5) for p in PROMPTS]
    run(engine, {0: batch})
    per_pass = sum(layer.host.numel() for layer in residency.streamed)
    first = residency.streamed[0].host.numel()  # copied ahead for the step after the last
    assert sum(streamed) == per_pass * engine.steps + first, "one stream of the non-resident layers per step"
    assert engine.steps == 5, "the 4 prompts prefill in one step, then 4 decode steps serve all 4 sequences"


@pytest.mark.parametrize("concurrency,expected", [(1, [1]), (2, [1, 2]), (8, [1, 2, 4, 8]), (12, [1, 2, 4, 8, 12])])
def test_graph_buckets_are_powers_of_two_up_to_the_concurrency(concurrency, expected):
    from engine.forward.graphs import buckets

    assert buckets(concurrency) == expected


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["resident", "swap"])
def test_graph_replayed_decode_gives_the_eager_tokens_on_cuda(tiny_models, mode):
    """CUDA only: the same batch decoded through captured graphs and eagerly gives the same tokens."""
    cuda = torch.device("cuda")

    def batch_tokens(graphs: bool) -> list[list[int]]:
        model = AutoModelForCausalLM.from_pretrained(tiny_models["llama"], local_files_only=True).eval()
        residency = make_residency(mode, model, DeviceLedger("m", 64 * MiB, cuda), cuda)
        residency.load()
        engine = ModelEngine(residency, concurrency=4, context_tokens=96, kv_bytes=0, prefill_chunk=8, graphs=graphs)
        if mode == "swap":
            engine.activate()
        batch = [greedy(p) for p in PROMPTS]
        run(engine, {0: batch[:2], 4: batch[2:]})
        if graphs:
            assert engine.forward.graphs, "no decode step was replayed from a graph"
            assert residency.ledger.peak_bytes <= residency.ledger.budget_bytes
        return [g.output_ids for g in batch]

    assert batch_tokens(graphs=True) == batch_tokens(graphs=False)


def graphed_engine(residency, capture, *, concurrency=4):
    """A decoder-path engine whose forward replays per-bucket decode steps through `capture`."""
    from engine.forward.graphs import GraphedDecoder

    engine = engine_of(residency, concurrency=concurrency)
    engine.forward = GraphedDecoder(engine.forward, capture=capture)
    return engine


def test_bucketed_decode_replays_give_the_eager_tokens_with_joins_and_leaves(tiny_models):
    """The graph path on CPU: static buffers padded to the batch bucket, rows mapped by slot, the shape-static
    decode step over the KV-length bucket of the longest row (eager_capture runs it without a graph)."""
    from engine.forward.graphs import eager_capture

    residency = residency_of(tiny_models["qwen2"], "resident", None)
    prompts, lengths = [[72, 105, 33], [1, 2, 3], [9, 8, 7], [4, 4, 4]], [6, 40, 3, 9]
    arrivals = lambda batch: {0: batch[:3], 4: [batch[3]]}  # noqa: E731  (3 of 4 slots, then 4)
    eager = [greedy(p, n) for p, n in zip(prompts, lengths)]
    run(engine_of(residency, concurrency=4), arrivals(eager))
    replayed = [greedy(p, n) for p, n in zip(prompts, lengths)]
    engine = graphed_engine(residency, eager_capture)
    replays = []
    engine.forward.capture = lambda inner, b, n, prev: _counted(eager_capture(inner, b, n, prev), replays, (b, n))
    run(engine, arrivals(replayed))
    assert [g.output_ids for g in replayed] == [g.output_ids for g in eager]
    assert {b for b, _ in replays} == {1, 2, 4}, "3 and 4 decoding used bucket 4 (3 padded), then 2 and 1"
    assert {n for _, n in replays} == {32, 64}, "the KV length follows the longest row: 32 keys, then 64"


def _counted(captured, replays, pair):
    replay = captured.replay
    captured.replay = lambda: (replays.append(pair), replay())
    return captured


def test_every_graph_is_captured_before_the_model_serves(tiny_models):
    from engine.forward.graphs import GraphedDecoder, eager_capture

    residency = residency_of(tiny_models["llama"], "resident", None)
    engine = engine_of(residency, concurrency=4)
    forward = GraphedDecoder(engine.forward, capture=eager_capture)
    forward.release()
    forward.allocate()
    assert sorted(forward.graphs) == [(b, n) for b in (1, 2, 4) for n in (32, 64, 96)]


def test_a_failed_capture_decodes_eagerly_and_a_pool_past_the_budget_is_not_kept(tiny_models, caplog):
    from engine.forward.graphs import eager_capture

    residency = residency_of(tiny_models["llama"], "resident", None)
    expected = [greedy(p) for p in PROMPTS[:2]]
    run(engine_of(residency, concurrency=4), {0: expected})

    def broken(inner, bucket, length, previous):
        raise RuntimeError("operation not permitted when stream is capturing")

    failed = graphed_engine(residency, broken)
    batch = [greedy(p) for p in PROMPTS[:2]]
    run(failed, {0: batch})
    assert [g.output_ids for g in batch] == [g.output_ids for g in expected]
    assert not failed.forward.graphs and {b for b, _ in failed.forward.eager} == {1, 2, 4}
    assert "decoding eagerly" in caplog.text

    def huge_pool(inner, bucket, length, previous):
        captured = eager_capture(inner, bucket, length, previous)
        captured.pool_bytes = residency.ledger.budget_bytes
        return captured

    over = graphed_engine(residency, huge_pool)
    batch = [greedy(p) for p in PROMPTS[:2]]
    run(over, {0: batch})
    assert [g.output_ids for g in batch] == [g.output_ids for g in expected]
    assert not over.forward.graphs and residency.ledger.reserved("cuda-graphs") == 0
    assert residency.ledger.peak_bytes <= residency.ledger.budget_bytes


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_a_sequence_that_has_not_run_yet_can_move_into_a_freed_slot(tiny_models, family):
    """A 4-token chunk: the first prompt (3 tokens, 1 output) finishes in step 0 beside one token of the
    second; the third has not run when it moves into slot 0."""
    residency = residency_of(tiny_models[family], "resident", None)
    prompts = [[72, 105, 33], [1, 2, 3, 4, 5], [9, 8, 7]]
    alone = []
    for prompt, tokens in zip(prompts, (1, 4, 4)):
        generation = greedy(prompt, tokens)
        run(engine_of(residency, concurrency=1, chunk=4), {0: [generation]})
        alone.append(generation.output_ids)
    batch = [greedy(p, n) for p, n in zip(prompts, (1, 4, 4))]
    engine = engine_of(residency, concurrency=3, chunk=4)
    for generation in batch:
        engine.join(generation)
    engine.step()
    assert batch[0].done and batch[2].slot == 0 and batch[2].cached == 0, "the unrun sequence moved to slot 0"
    run(engine, {})
    assert [g.output_ids for g in batch] == alone
