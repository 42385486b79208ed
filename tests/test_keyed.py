"""Keyed sampling and the repetition penalty, in pure numpy."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import dense

from specli.decode.sampling import Distribution, SamplingSettings, keyed_choice, keyed_uniforms, verify_keyed

CHI2_999 = {2: 13.82, 3: 16.27, 4: 18.47}


def dist(probs: list[float]) -> Distribution:
    ids = np.flatnonzero(np.asarray(probs) > 0)
    return Distribution(ids.astype(np.int64), np.asarray(probs, dtype=np.float64)[ids])


def chi_square(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = counts.sum() * probs
    mask = expected > 0
    return float(((counts[mask] - expected[mask]) ** 2 / expected[mask]).sum())


@pytest.mark.slow  # tens of thousands of draws
@pytest.mark.parametrize("vary", ["seed", "position"])
def test_keyed_draws_follow_the_distribution(vary):
    p = dist([0.1, 0.0, 0.5, 0.15, 0.25])
    draws = [keyed_choice(p, i, 3) if vary == "seed" else keyed_choice(p, 11, i) for i in range(40_000)]
    counts = np.bincount(draws, minlength=5).astype(float)
    assert counts[1] == 0
    assert chi_square(counts, dense(p, 5)) < CHI2_999[4]


def test_keyed_uniforms_depend_on_seed_position_and_id_only():
    ids = np.array([3, 7, 262_143])
    a = keyed_uniforms(5, 100, ids)
    assert np.array_equal(a, keyed_uniforms(5, 100, ids))
    assert np.array_equal(a[1:], keyed_uniforms(5, 100, ids[1:])), "not on which other ids are candidates"
    assert not np.array_equal(a, keyed_uniforms(6, 100, ids))
    assert not np.array_equal(a, keyed_uniforms(5, 101, ids))
    assert ((a > 0) & (a < 1)).all()


@pytest.mark.slow  # tens of thousands of draws
def test_consecutive_positions_are_independent():
    """The pair (draw at t, draw at t + 1) over many seeds: the joint is the product."""
    p = dist([0.3, 0.7])
    pairs = np.array([[keyed_choice(p, seed, 9), keyed_choice(p, seed, 10)] for seed in range(30_000)])
    joint = np.bincount(pairs[:, 0] * 2 + pairs[:, 1], minlength=4).astype(float)
    assert chi_square(joint, np.outer([0.3, 0.7], [0.3, 0.7]).ravel()) < CHI2_999[3]


def test_verify_keyed_keeps_a_draft_while_it_equals_the_targets_draws():
    targets = [dist([0.2, 0.3, 0.5])] * 4
    seed, position = 42, 17
    choices = [keyed_choice(t, seed, position + i) for i, t in enumerate(targets)]
    assert verify_keyed(choices[:3], targets, seed, position) == (3, choices[3])
    wrong = (choices[1] + 1) % 3
    assert verify_keyed([choices[0], wrong, choices[2]], targets, seed, position) == (1, choices[1])


def test_the_repetition_penalty_divides_positive_and_multiplies_negative_logits():
    settings = SamplingSettings(repeat_penalty=2.0, repeat_last_n=3)
    row = np.array([4.0, -1.0, 3.0, 2.0, -2.0], dtype=np.float32)
    out = settings.penalise(row, [0, 0, 4, 1, 2])  # the last 3: 4, 1, 2
    assert out.tolist() == [4.0, -2.0, 1.5, 2.0, -4.0]
    assert row.tolist() == [4.0, -1.0, 3.0, 2.0, -2.0], "the row itself is untouched"
    assert SamplingSettings().penalise(row, [0, 1]) is row


def test_openais_penalties_count_the_output_and_the_bias_adds():
    """OpenAI's definitions: logit less frequency_penalty times the token's count in the
    output, less presence_penalty once it is there; logit_bias added. The prompt (context
    before the output) is not counted."""
    settings = SamplingSettings(frequency_penalty=0.5, presence_penalty=1.0, logit_bias=((4, -100.0), (0, 2.0)))
    row = np.array([4.0, -1.0, 3.0, 2.0, -2.0], dtype=np.float32)
    out = settings.penalise(row, [3, 3, 1, 2, 2], output=[1, 2, 2])
    assert out.tolist() == [6.0, -2.5, 1.0, 2.0, -102.0]
    assert row.tolist() == [4.0, -1.0, 3.0, 2.0, -2.0], "the row itself is untouched"
    assert SamplingSettings(presence_penalty=1.0).penalise(row, [1, 2]).tolist() == row.tolist(), "no output yet"
    assert not SamplingSettings().penalises and SamplingSettings(logit_bias=((1, 1.0),)).penalises
