"""Rejection sampling reproduces the target's distribution; greedy verification rules."""

from __future__ import annotations

import numpy as np
import pytest
from fakes import FakeModel
from helpers import RecordingRows, dense, generated

from specli.decode.draft_model import DraftModel, DraftModelProposer
from specli.decode.engine import Engine
from specli.decode.events import Token
from specli.decode.ngram import NGramProposer
from specli.decode.policy import FixedDraftPolicy
from specli.decode.request import GenerationRequest
from specli.decode.sampling import Distribution, SamplingSettings, verify_greedy, warp

# Chi-square critical values at significance 0.001 (df -> value): a correct sampler fails
# one run in a thousand; the seeds are fixed, so the outcome is deterministic.
CHI2_999 = {3: 16.27, 5: 20.52, 7: 24.32, 11: 31.26, 15: 37.70, 24: 51.18, 35: 66.62}


def chi_square(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = probs * counts.sum()
    mask = expected > 0
    assert counts[~mask].sum() == 0, "a token with probability 0 was produced"
    return float((((counts - expected) ** 2)[mask] / expected[mask]).sum())


def dist(probs) -> Distribution:
    probs = np.asarray(probs, dtype=np.float64)
    ids = np.flatnonzero(probs > 0)
    return Distribution(ids, probs[ids] / probs[ids].sum())


def rows(*best: int, n_vocab: int = 10) -> np.ndarray:
    """Logits rows whose argmax is each given token."""
    logits = np.zeros((len(best), n_vocab), dtype=np.float32)
    logits[np.arange(len(best)), best] = 1.0
    return logits


def test_verify_greedy_keeps_the_longest_agreeing_prefix():
    assert verify_greedy([4, 5, 6], rows(4, 5, 9, 1)) == (2, 9)
    assert verify_greedy([4, 5, 6], rows(4, 5, 6, 1)) == (3, 1)  # bonus token
    assert verify_greedy([4], rows(3, 8)) == (0, 3)
    assert verify_greedy([], rows(7)) == (0, 7)


def test_verify_greedy_reads_no_row_after_the_first_rejection():
    logits = RecordingRows(rows(4, 2, 0, 0))
    assert verify_greedy([4, 5, 6], logits) == (1, 2)
    assert sorted(set(logits.read)) == [0, 1]


def first_two_tokens_distribution(model: FakeModel, prompt: list[int], settings: SamplingSettings) -> np.ndarray:
    n = model.n_vocab
    first = dense(warp(model.logits_after(prompt), settings), n)
    joint = np.zeros((n, n))
    for a in np.flatnonzero(first):
        joint[a] = first[a] * dense(warp(model.logits_after(prompt + [int(a)]), settings), n)
    return joint.ravel()


@pytest.mark.slow  # tens of thousands of draws
@pytest.mark.parametrize("proposer_kind", ["draft", "ngram"])
def test_engine_at_temperature_samples_the_targets_joint_distribution(proposer_kind):
    """Two tokens through the whole loop (propose, verify, rewind, bonus) follow p exactly."""
    settings = SamplingSettings(temperature=1.0, top_k=5)
    prompt = [1, 2, 1]
    n = 6
    expected = first_two_tokens_distribution(FakeModel(n_vocab=n, sharpness=1.0), prompt, settings)
    counts = np.zeros(n * n)
    master = np.random.default_rng(99)
    target = FakeModel(n_vocab=n, sharpness=1.0)
    trials = 12_000
    for _ in range(trials):
        seed = int(master.integers(1 << 62))
        if proposer_kind == "draft":
            draft = FakeModel(n_vocab=n, sharpness=1.0, noise_seed=5, noise=3.0)
            proposer = DraftModelProposer(DraftModel(draft), settings, seed)
        else:
            proposer = NGramProposer(lengths=(2, 1))
        engine = Engine(target, proposer, FixedDraftPolicy(3), GenerationRequest(max_tokens=2, sampling=settings, seed=seed))
        ids = generated(engine, prompt)[0]
        counts[ids[0] * n + ids[1]] += 1
    support = int((expected > 0).sum())
    critical = CHI2_999[support - 1] if support - 1 in CHI2_999 else support - 1 + 4 * np.sqrt(2 * (support - 1))
    assert chi_square(counts, expected) < critical


def test_warp_applies_top_k_top_p_min_p():
    logits = np.log(np.array([0.4, 0.3, 0.15, 0.1, 0.05], dtype=np.float32))
    assert set(warp(logits, SamplingSettings(1.0, top_k=2)).ids) == {0, 1}
    assert set(warp(logits, SamplingSettings(1.0, top_p=0.8)).ids) == {0, 1, 2}
    assert set(warp(logits, SamplingSettings(1.0, min_p=0.3)).ids) == {0, 1, 2}
    full = warp(logits, SamplingSettings(1.0))
    assert np.allclose(dense(full, 5), [0.4, 0.3, 0.15, 0.1, 0.05], atol=1e-6)
    cold = dense(warp(logits, SamplingSettings(0.5)), 5)
    assert cold[0] > 0.4 and np.isclose(cold.sum(), 1.0)


def dense_warp(logits: np.ndarray, settings: SamplingSettings) -> np.ndarray:
    """The definition, written the slow way: sort the whole vocabulary at every stage."""
    logits = logits.astype(np.float64)
    alive = logits >= logits.max() - 50.0 * settings.temperature
    if settings.top_k:
        kth = np.sort(logits[alive])[::-1][min(settings.top_k, alive.sum()) - 1]
        alive &= logits >= kth
    probs = np.where(alive, np.exp((logits - logits.max()) / settings.temperature), 0.0)
    probs /= probs.sum()
    if settings.top_p < 1.0:
        order = np.lexsort((np.arange(probs.size), -probs))
        cut = int(np.searchsorted(np.cumsum(probs[order]), settings.top_p, side="left")) + 1
        nucleus = np.zeros_like(alive)
        nucleus[order[:cut]] = True
        alive &= nucleus
    if settings.min_p > 0.0:
        alive &= probs >= settings.min_p * probs.max()
    out = np.where(alive, probs, 0.0)
    return out / out.sum()


@pytest.mark.parametrize("top_k", [0, 1, 40, 5000])
@pytest.mark.parametrize("top_p", [1.0, 0.95, 0.5])
@pytest.mark.parametrize("min_p", [0.0, 0.05])
@pytest.mark.parametrize("temperature", [0.3, 0.8, 2.0])
def test_warp_on_a_full_vocabulary_matches_the_dense_definition(top_k, top_p, min_p, temperature):
    rng = np.random.default_rng(hash((top_k, top_p, min_p, temperature)) % 2**32)
    # Vocabulary-sized rows shaped like real logits: a few strong candidates, a long tail.
    logits = (rng.normal(size=262_144) * 3.0).astype(np.float32)
    logits[rng.integers(0, logits.size, 30)] += rng.uniform(5, 15, 30).astype(np.float32)
    settings = SamplingSettings(temperature, top_k, top_p, min_p)
    np.testing.assert_allclose(dense(warp(logits, settings), logits.size), dense_warp(logits, settings),
                               rtol=1e-9, atol=1e-12)


def test_sampled_generation_repeats_with_the_same_seeds_and_changes_with_others():
    settings = SamplingSettings(temperature=1.0)

    def generate(seed: int) -> list[int]:
        draft = FakeModel(sharpness=1.0, noise_seed=5, noise=2.0)
        proposer = DraftModelProposer(DraftModel(draft), settings, seed)
        engine = Engine(FakeModel(sharpness=1.0), proposer, FixedDraftPolicy(3),
                        GenerationRequest(max_tokens=40, sampling=settings, seed=seed))
        return [e.id for e in engine.generate([1, 2, 3]) if isinstance(e, Token)]

    first = generate(5)
    assert len(first) == 40
    assert generate(5) == first
    assert generate(6) != first
