"""engine.sampling: the batched device sampler. Penalties, logit_bias, top-k, top-p, seeds and reported
log-probabilities on hand-made logits where the right token is known by construction; penalties against a
reference implementation row by row; the sampled distribution against the softmax with fixed seeds; and
the table kept on the device between steps against one rebuilt every step."""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import pytest
import torch

from engine.sampling import BatchSampler, Choice, SamplingParams


@dataclass(eq=False)
class Row:
    params: SamplingParams
    seed: int = 0
    prompt_ids: list[int] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    constraint: object = None
    banned: tuple[int, ...] = ()


class Only:
    """A grammar that allows the same tokens at every step (its bitmask in the library's bit layout)."""

    finished = False

    def __init__(self, vocab: int, tokens: set[int]):
        self.words = torch.zeros((vocab + 31) // 32, dtype=torch.int32)
        for token in tokens:
            self.words[token // 32] |= 1 << (token % 32)

    def bitmask(self) -> torch.Tensor:
        return self.words

    def advance(self, token: int) -> None:
        pass


def params(**fields) -> SamplingParams:
    return SamplingParams(max_tokens=8, **fields)


def logits(*values: float) -> torch.Tensor:
    return torch.tensor([values], dtype=torch.float32)


def one(fields: dict, row, history=(), seed=0) -> Choice:
    return BatchSampler().choose(logits(*row), [Row(params(**fields), seed, [], list(history))])[0]


@pytest.mark.parametrize("case,fields,row,history,expected", [
    ("greedy-takes-the-largest", dict(temperature=0), (0.0, 3.0, 1.0), (), 1),
    ("frequency-penalty-counts-repeats", dict(temperature=0, frequency_penalty=1.0), (0.0, 3.0, 2.5), (1, 1), 2),
    ("frequency-penalty-one-repeat-not-enough", dict(temperature=0, frequency_penalty=0.4), (0.0, 3.0, 2.5), (1,), 1),
    ("presence-penalty-once-per-token", dict(temperature=0, presence_penalty=0.6), (0.0, 3.0, 2.5), (1, 1, 1), 2),
    ("negative-presence-favours-seen", dict(temperature=0, presence_penalty=-2.0), (0.0, 3.0, 2.5), (2,), 2),
    ("penalties-ignore-unseen", dict(temperature=0, frequency_penalty=2.0), (0.0, 3.0, 2.5), (0, 2), 1),
    ("repetition-divides-a-positive-seen-logit", dict(temperature=0, repetition_penalty=2.0), (0.0, 3.0, 2.5), (1,), 2),
    ("repetition-multiplies-a-negative-seen-logit", dict(temperature=0, repetition_penalty=2.0), (-1.0, -1.5, -3.0),
     (0,), 1),
    ("logit-bias-bans-the-best", dict(temperature=0, logit_bias=((1, -100.0),)), (0.0, 3.0, 1.0), (), 2),
    ("logit-bias-forces-a-token", dict(temperature=0, logit_bias=((0, 100.0),)), (0.0, 3.0, 1.0), (), 0),
    ("top-k-one-is-greedy-at-any-temperature", dict(temperature=2.0, top_k=1, seed=3), (0.0, 3.0, 2.9), (), 1),
    ("tiny-top-p-is-greedy", dict(temperature=1.0, top_p=1e-6, seed=3), (0.0, 3.0, 2.9), (), 1),
    ("bias-then-top-k", dict(temperature=1.0, top_k=1, seed=3, logit_bias=((1, -100.0),)), (0.0, 3.0, 2.9), (), 2),
])
def test_the_chosen_token(case, fields, row, history, expected):
    assert one(fields, row, history).token == expected, case


def test_repetition_penalty_counts_prompt_tokens():
    row = Row(params(temperature=0, repetition_penalty=4.0), prompt_ids=[1])
    assert BatchSampler().choose(logits(0.0, 3.0, 1.0), [row])[0].token == 2


def batch_of_seeds(fields: dict, values, n: int) -> list[int]:
    rows = [Row(params(**fields), seed) for seed in range(n)]
    return [c.token for c in BatchSampler().choose(torch.tensor([values] * n, dtype=torch.float32), rows)]


def test_top_k_never_samples_outside_the_k_best():
    assert set(batch_of_seeds(dict(temperature=2.0, top_k=3), (5.0, 4.9, 0.0, 4.8, -1.0, 0.1), 300)) == {0, 1, 3}


def test_top_k_larger_than_the_vocabulary_keeps_every_token():
    assert set(batch_of_seeds(dict(temperature=1.0, top_k=1000), (0.0,) * 4, 300)) == {0, 1, 2, 3}


@pytest.mark.parametrize("case,fields", [
    ("temperature", dict(temperature=0.7)),
    ("top-p", dict(temperature=1.0, top_p=0.8)),
    ("top-k", dict(temperature=1.3, top_k=3)),
])
def test_the_sampled_frequencies_follow_the_kept_softmax(case, fields):
    """4000 rows with distinct seeds: each token's frequency within 5 standard errors of its probability."""
    values = torch.tensor([2.0, 1.5, 1.0, 0.2, -0.5, -3.0])
    n = 4000
    scaled = values / fields["temperature"]
    ranked, order = scaled.sort(descending=True)
    kept = torch.ones(6, dtype=torch.bool)
    if "top_k" in fields:
        kept[fields["top_k"]:] = False
    if "top_p" in fields:
        probs = torch.softmax(ranked, -1)
        kept &= probs.cumsum(-1) - probs <= fields["top_p"]
    expected = torch.zeros(6)
    expected[order] = torch.softmax(ranked.masked_fill(~kept, float("-inf")), -1)
    counts = torch.bincount(torch.tensor(batch_of_seeds(fields, values.tolist(), n)), minlength=6).float() / n
    for token in range(6):
        p = float(expected[token])
        assert abs(float(counts[token]) - p) <= 5 * math.sqrt(max(p * (1 - p), 1e-9) / n) + 1e-9, (case, token)


def reference_adjusted(row: list[float], p: SamplingParams, prompt: list[int], history: list[int]) -> list[float]:
    """The penalties and bias written out token by token (vLLM's repetition, then OpenAI's formula)."""
    out = list(row)
    seen = set(prompt) | set(history)
    for token in range(len(out)):
        if token in seen and p.repetition_penalty != 1.0:
            out[token] = out[token] / p.repetition_penalty if out[token] > 0 else out[token] * p.repetition_penalty
        count = history.count(token)
        out[token] -= count * p.frequency_penalty + (count > 0) * p.presence_penalty
    for token, bias in p.logit_bias:
        out[token] += bias
    return out


def test_penalties_and_bias_match_the_reference_row_by_row():
    rng = random.Random(5)
    vocab, rows, values = 12, [], []
    for _ in range(64):
        p = params(temperature=0, frequency_penalty=rng.choice([0.0, 0.5, -0.3]),
                   presence_penalty=rng.choice([0.0, 1.1]), repetition_penalty=rng.choice([1.0, 1.7]),
                   logit_bias=tuple((rng.randrange(vocab), rng.uniform(-3, 3)) for _ in range(rng.randrange(3))))
        rows.append(Row(p, 0, [rng.randrange(vocab) for _ in range(3)], [rng.randrange(vocab) for _ in range(5)]))
        values.append([rng.uniform(-4, 4) for _ in range(vocab)])
    chosen = [c.token for c in BatchSampler().choose(torch.tensor(values), rows)]
    expected = []
    for row, v in zip(rows, values):
        adjusted = reference_adjusted(v, row.params, row.prompt_ids, row.output_ids)
        expected.append(max(range(vocab), key=lambda t: adjusted[t]))
    assert chosen == expected


def test_the_same_seed_gives_the_same_tokens_alone_or_in_any_batch_and_another_seed_other_tokens():
    values = torch.zeros(64)

    def draw(seed, company=0):
        rows = [Row(params(temperature=1.0), seed)] + [Row(params(temperature=1.0), 1000 + i) for i in range(company)]
        sampler, out = BatchSampler(), []
        for _ in range(20):
            choice = sampler.choose(values.expand(len(rows), 64), rows)
            for row, c in zip(rows, choice):
                row.output_ids.append(c.token)
            out.append(choice[0].token)
        return out

    assert draw(11) == draw(11) == draw(11, company=3)
    assert draw(11) != draw(12)


def test_the_table_kept_on_the_device_gives_the_tokens_of_one_rebuilt_every_step():
    """Counts, seen masks and noise keys advanced on the device equal the host history they came from."""
    torch.manual_seed(0)
    script = torch.randn(12, 3, 20)

    def run(rebuild: bool) -> list[list[int]]:
        rows = [Row(params(temperature=t, frequency_penalty=0.7, presence_penalty=0.3, repetition_penalty=1.3,
                           top_p=0.9, top_k=8), seed=s, prompt_ids=[1, 2])
                for t, s in ((0, 1), (0.8, 2), (1.5, 3))]
        sampler = BatchSampler()
        for step in script:
            if rebuild:
                sampler = BatchSampler()
            for row, choice in zip(rows, sampler.choose(step, rows)):
                row.output_ids.append(choice.token)
        return [row.output_ids for row in rows]

    assert run(rebuild=False) == run(rebuild=True)


def test_a_grammar_and_bans_hold_for_each_row_greedy_or_sampled():
    """Row 0 and 1 follow grammars ({1, 2}; {1, 2, 3} less the banned 3), row 2 is free but bans 0, row 3 is
    free: one mask for the batch, each row its own."""
    rows = [Row(params(temperature=0), constraint=Only(40, {1, 2})),
            Row(params(temperature=1.0), 7, constraint=Only(40, {1, 2, 3}), banned=(3,)),
            Row(params(temperature=1.0, top_p=0.5), 8, banned=(0,)), Row(params(temperature=1.0), 9)]
    seen = [set() for _ in rows]
    for _ in range(60):
        for row, choice in zip(rows, BatchSampler().choose(torch.randn(4, 40) * 4, rows)):
            seen[rows.index(row)].add(choice.token)
        for row in rows:
            row.seed += 5
    assert seen[0] <= {1, 2} and seen[1] <= {1, 2} and 0 not in seen[2] and len(seen[3]) > 5


def test_a_ban_that_would_leave_a_row_nothing_keeps_what_the_grammar_allows():
    row = Row(params(temperature=0), constraint=Only(8, {5}), banned=(5,))
    assert BatchSampler().choose(torch.zeros(1, 8), [row])[0].token == 5


@pytest.mark.parametrize("seed", [-(1 << 63), (1 << 64) - 1, 0])
def test_every_64_bit_seed_the_api_accepts_seeds_the_noise(seed):
    assert one(dict(temperature=1.0, seed=seed), (0.0,) * 8, seed=seed).token in range(8)


def test_no_logprobs_unless_asked():
    assert one(dict(temperature=0), (0.0, 1.0)) == Choice(1)


def test_logprobs_are_the_models_own_before_penalties_bias_and_temperature():
    row = (1.0, 2.0, 3.0, 0.5)
    expected = torch.log_softmax(torch.tensor(row), dim=-1)
    choice = one(dict(temperature=0, logprobs=2, logit_bias=((2, -100.0),), frequency_penalty=2.0), row, (1,))
    assert choice.token == 0  # 2 is banned, 1 is penalised: 1.0 - 0 beats 2.0 - 2.0 and 0.5
    assert choice.logprob == pytest.approx(float(expected[0]))
    assert [t for t, _ in choice.top] == [2, 1]
    assert [lp for _, lp in choice.top] == pytest.approx([float(expected[2]), float(expected[1])])


def test_rows_asking_fewer_alternatives_get_their_own_count():
    rows = [Row(params(temperature=0, logprobs=1)), Row(params(temperature=0, logprobs=3)), Row(params(temperature=0))]
    choices = BatchSampler().choose(torch.tensor([[0.0, 1.0, 2.0, 3.0]] * 3), rows)
    assert [len(c.top) for c in choices] == [1, 3, 0] and choices[2].logprob is None


def test_zero_top_logprobs_reports_only_the_chosen_token():
    choice = one(dict(temperature=0, logprobs=0), (0.0, 1.0))
    assert choice.top == () and math.isclose(choice.logprob, float(torch.log_softmax(torch.tensor([0.0, 1.0]), -1)[1]))


def test_more_top_logprobs_than_the_vocabulary_lists_the_whole_vocabulary():
    choice = one(dict(temperature=0, logprobs=20), (0.0, 1.0, 2.0))
    assert [t for t, _ in choice.top] == [2, 1, 0]
