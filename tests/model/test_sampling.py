"""The reference sampler: filters behave as documented; the RNG is a pure function."""

from __future__ import annotations

import numpy as np
import pytest

from blink_edu.config import SamplingParams
from blink_edu.model.sampling import logit_adjustments, sample, token_logprobs, uniform


def test_uniform_is_a_deterministic_function_in_range():
    us = [uniform(s, c) for s in range(20) for c in range(50)]
    assert us == [uniform(s, c) for s in range(20) for c in range(50)]
    assert 0.0 <= min(us) and max(us) < 1.0
    assert 0.4 < np.mean(us) < 0.6 and len(set(us)) > 990


def test_greedy_is_argmax_with_lowest_id_on_ties(rng):
    logits = rng.normal(size=50).astype(np.float32)
    logits[[7, 30]] = logits.max() + 1
    assert sample(logits, SamplingParams(temperature=0), seed=0, counter=0) == 7


def test_top_k_one_is_greedy_and_top_p_keeps_only_the_nucleus(rng):
    logits = rng.normal(size=100) * 3
    best = int(np.argmax(logits))
    for c in range(20):
        assert sample(logits, SamplingParams(temperature=1.5, top_k=1), seed=3, counter=c) == best
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    order = np.argsort(-probs)
    nucleus = set(order[: np.searchsorted(np.cumsum(probs[order]), 0.5) + 1].tolist())
    picks = {sample(logits, SamplingParams(top_p=0.5), seed=11, counter=c) for c in range(300)}
    assert picks <= nucleus and len(picks) >= 1


def test_sampling_follows_the_distribution(rng):
    logits = np.log(np.array([0.5, 0.3, 0.2]))
    draws = [sample(logits, SamplingParams(), seed=int(rng.integers(2**31)), counter=c)
             for c in range(3000)]
    freq = np.bincount(draws, minlength=3) / len(draws)
    np.testing.assert_allclose(freq, [0.5, 0.3, 0.2], atol=0.04)


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_p=0), dict(top_p=1.5),
                                 dict(top_k=-2), dict(max_tokens=0), dict(temperature=float("nan")),
                                 dict(presence_penalty=2.5), dict(frequency_penalty=-3),
                                 dict(logit_bias=((5, 101.0),)), dict(logit_bias=((-1, 1.0),)),
                                 dict(logit_bias=((5, 1.0), (5, 2.0))), dict(logprobs=-1)])
def test_bad_sampling_params_are_rejected(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)


def test_logit_bias_minus_100_bans_a_token_and_plus_100_forces_one(rng):
    logits = (3 * rng.standard_normal(60)).astype(np.float32)
    best, other = int(np.argmax(logits)), int(np.argmin(logits))
    banned = SamplingParams(temperature=0, logit_bias=((best, -100.0),))
    assert sample(logits, banned, seed=0, counter=0) != best
    for c in range(50):  # sampled at a high temperature: still never the banned one
        hot = SamplingParams(temperature=2.0, logit_bias=((best, -100.0),))
        assert sample(logits, hot, seed=int(rng.integers(2**31)), counter=c) != best
    forced = SamplingParams(temperature=1.0, logit_bias=((other, 100.0),))
    assert {sample(logits, forced, seed=int(rng.integers(2**31)), counter=c)
            for c in range(50)} == {other}


def test_penalties_subtract_as_openai_defines(rng):
    """frequency: count * penalty; presence: penalty once if the count is > 0; bias added."""
    outputs = rng.integers(0, 20, size=30).tolist()
    params = SamplingParams(frequency_penalty=float(rng.uniform(0.1, 2)),
                            presence_penalty=float(rng.uniform(-2, 2)),
                            logit_bias=((3, 5.0), (25, -7.5)))
    ids, deltas = logit_adjustments(params, outputs)
    counts = np.bincount(outputs, minlength=30)
    expected = {t: -params.frequency_penalty * counts[t] - params.presence_penalty
                for t in range(30) if counts[t]}
    expected[3] = expected.get(3, 0.0) + 5.0
    expected[25] = -7.5
    assert ids.tolist() == sorted(expected)
    np.testing.assert_allclose(deltas, [expected[t] for t in sorted(expected)], rtol=1e-6)


def test_a_frequency_penalty_changes_the_greedy_token_once_it_repeats(rng):
    logits = (rng.standard_normal(40)).astype(np.float32)
    order = np.argsort(-logits)
    best, second = int(order[0]), int(order[1])
    gap = float(logits[best] - logits[second])
    penalty = SamplingParams(temperature=0, frequency_penalty=2.0)
    repeats = int(gap // 2.0) + 1  # generated this often, best falls below second
    assert sample(logits, penalty, 0, 0, output_token_ids=[best] * (repeats - 1)) == best
    assert sample(logits, penalty, 0, 0, output_token_ids=[best] * repeats) != best
    presence = SamplingParams(temperature=0, presence_penalty=2.0)
    expected = best if gap > 2.0 else second
    assert sample(logits, presence, 0, 0, output_token_ids=[best] * 5) == expected


def test_token_logprobs_are_the_log_softmax(rng):
    logits = (3 * rng.standard_normal(50)).astype(np.float32)
    token = int(rng.integers(50))
    got = token_logprobs(logits, token, top_n=4)
    logp = logits.astype(np.float64) - np.log(np.exp(logits.astype(np.float64)).sum())
    assert got.logprob == pytest.approx(logp[token])
    assert [t for t, _ in got.top] == np.argsort(-logp)[:4].tolist()
    assert [lp for _, lp in got.top] == pytest.approx(np.sort(logp)[::-1][:4])
    assert token_logprobs(logits, token, top_n=0).top == ()
