"""worker.sampling: penalties, logit_bias, top-k, top-p, seeds and reported log-probabilities on
hand-made logits, where the right token is known by construction."""
from __future__ import annotations

import math

import pytest
import torch

from worker.sampling import Choice, Sampler, SamplingParams


def params(**fields) -> SamplingParams:
    return SamplingParams(max_tokens=8, **fields)


def logits(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


@pytest.mark.parametrize("case,fields,row,history,expected", [
    ("greedy-takes-the-largest", dict(temperature=0), (0.0, 3.0, 1.0), (), 1),
    ("frequency-penalty-counts-repeats", dict(temperature=0, frequency_penalty=1.0), (0.0, 3.0, 2.5), (1, 1), 2),
    ("frequency-penalty-one-repeat-not-enough", dict(temperature=0, frequency_penalty=0.4), (0.0, 3.0, 2.5), (1,), 1),
    ("presence-penalty-once-per-token", dict(temperature=0, presence_penalty=0.6), (0.0, 3.0, 2.5), (1, 1, 1), 2),
    ("negative-presence-favours-seen", dict(temperature=0, presence_penalty=-2.0), (0.0, 3.0, 2.5), (2,), 2),
    ("penalties-ignore-unseen", dict(temperature=0, frequency_penalty=2.0), (0.0, 3.0, 2.5), (0, 2), 1),
    ("logit-bias-bans-the-best", dict(temperature=0, logit_bias=((1, -100.0),)), (0.0, 3.0, 1.0), (), 2),
    ("logit-bias-forces-a-token", dict(temperature=0, logit_bias=((0, 100.0),)), (0.0, 3.0, 1.0), (), 0),
    ("top-k-one-is-greedy-at-any-temperature", dict(temperature=2.0, top_k=1, seed=3), (0.0, 3.0, 2.9), (), 1),
    ("tiny-top-p-is-greedy", dict(temperature=1.0, top_p=1e-6, seed=3), (0.0, 3.0, 2.9), (), 1),
    ("bias-then-top-k", dict(temperature=1.0, top_k=1, seed=3, logit_bias=((1, -100.0),)), (0.0, 3.0, 2.9), (), 2),
])
def test_the_chosen_token(case, fields, row, history, expected):
    assert Sampler(params(**fields)).choose(logits(*row), history).token == expected, case


def test_top_k_never_samples_outside_the_k_best():
    row = logits(5.0, 4.9, 0.0, 4.8, -1.0, 0.1)
    sampler = Sampler(params(temperature=2.0, top_k=3, seed=7))
    assert {sampler.choose(row).token for _ in range(300)} == {0, 1, 3}


def test_top_k_larger_than_the_vocabulary_keeps_every_token():
    row = torch.zeros(4)
    sampler = Sampler(params(temperature=1.0, top_k=1000, seed=1))
    assert {sampler.choose(row).token for _ in range(300)} == {0, 1, 2, 3}


def test_the_same_seed_gives_the_same_tokens_and_another_seed_other_tokens():
    row = torch.zeros(64)

    def draw(seed):
        sampler = Sampler(params(temperature=1.0, seed=seed))
        return [sampler.choose(row).token for _ in range(20)]

    assert draw(11) == draw(11)
    assert draw(11) != draw(12)


@pytest.mark.parametrize("seed", [-(1 << 63), (1 << 64) - 1, 0])
def test_every_64_bit_seed_the_api_accepts_seeds_the_generator(seed):
    assert Sampler(params(temperature=1.0, seed=seed)).choose(torch.zeros(8)).token in range(8)


def test_no_logprobs_unless_asked():
    assert Sampler(params(temperature=0)).choose(logits(0.0, 1.0)) == Choice(1)


def test_logprobs_are_the_models_own_before_penalties_bias_and_temperature():
    row = logits(1.0, 2.0, 3.0, 0.5)
    expected = torch.log_softmax(row, dim=-1)
    choice = Sampler(params(temperature=0, logprobs=2, logit_bias=((2, -100.0),), frequency_penalty=2.0)).choose(
        row, (1,))
    assert choice.token == 0  # 2 is banned, 1 is penalised: 1.0 - 0 beats 2.0 - 2.0 and 0.5
    assert choice.logprob == pytest.approx(float(expected[0]))
    assert [t for t, _ in choice.top] == [2, 1]
    assert [lp for _, lp in choice.top] == pytest.approx([float(expected[2]), float(expected[1])])


def test_zero_top_logprobs_reports_only_the_chosen_token():
    choice = Sampler(params(temperature=0, logprobs=0)).choose(logits(0.0, 1.0))
    assert choice.top == () and math.isclose(choice.logprob, float(torch.log_softmax(logits(0.0, 1.0), -1)[1]))


def test_more_top_logprobs_than_the_vocabulary_lists_the_whole_vocabulary():
    choice = Sampler(params(temperature=0, logprobs=20)).choose(logits(0.0, 1.0, 2.0))
    assert [t for t, _ in choice.top] == [2, 1, 0]
