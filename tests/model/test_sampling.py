"""The reference sampler: filters behave as documented; the RNG is a pure function."""

from __future__ import annotations

import numpy as np
import pytest

from blink_edu.config import SamplingParams
from blink_edu.model.sampling import sample, uniform


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
                                 dict(top_k=-2), dict(max_tokens=0), dict(temperature=float("nan"))])
def test_bad_sampling_params_are_rejected(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)
