"""A draft model with n-gram lookup in front: the same output as the draft model alone, with
fewer of the draft model's decodes where the text copies itself."""

from __future__ import annotations

import json

import pytest
from fakes import FakeModel, plain_greedy
from helpers import generated

from specli.decode.adaptive import AdaptiveDraftPolicy
from specli.decode.costs import StepCosts
from specli.decode.draft_model import DraftModel, DraftModelProposer
from specli.decode.engine import Engine
from specli.decode.events import Token
from specli.decode.ngram import NGramProposer
from specli.decode.policy import FixedDraftPolicy
from specli.decode.proposers import LookupThenModel
from specli.decode.request import GenerationRequest
from specli.decode.sampling import SamplingSettings

# A periodic prompt: the toy model (order 1) keeps cycling, so lookup proposes long copies.
PROMPT = [1, 2, 3, 4, 5, 6, 7, 8] * 3


def costs(draft_per_token: float = 0.2) -> StepCosts:
    return StepCosts({1: 1.0, 2: 1.2, 4: 1.5, 8: 2.0, 16: 3.0, 32: 5.0, 49: 7.0}, draft_per_token, 0.02, "calibrated")


def generate(proposer, policy, target, max_tokens: int = 60):
    engine = Engine(target, proposer, policy, GenerationRequest(max_tokens))
    events = list(engine.generate(PROMPT))
    return [e.id for e in events if isinstance(e, Token) and e.id >= 0], engine.stats, events


@pytest.mark.parametrize("policy", [lambda: FixedDraftPolicy(6), lambda: AdaptiveDraftPolicy(costs(), NGramProposer.prior)])
def test_lookup_in_front_writes_the_same_text_with_fewer_draft_model_decodes(policy):
    target = FakeModel(seed=5, order=1, n_vocab=9)
    reference = plain_greedy(target, PROMPT, 60)
    # A draft model good enough to pay on its own (-k auto keeps drafting with it alone).
    alone_draft = FakeModel(seed=5, order=1, n_vocab=9, noise_seed=1, noise=0.2)
    alone, _, _ = generate(DraftModelProposer(DraftModel(alone_draft), SamplingSettings()), policy(), FakeModel(seed=5, order=1, n_vocab=9))
    both_draft = FakeModel(seed=5, order=1, n_vocab=9, noise_seed=1, noise=0.2)
    both, stats, events = generate(LookupThenModel(NGramProposer(), DraftModelProposer(DraftModel(both_draft), SamplingSettings())),
                                   policy(), FakeModel(seed=5, order=1, n_vocab=9))
    assert alone == both == reference
    assert sum(both_draft.batch_sizes) < sum(alone_draft.batch_sizes), "lookup spared draft-model decodes"
    assert stats.drafted_by.get("ngram", 0) > 0
    assert {e.proposer for e in events if isinstance(e, Token) and e.source == "draft"} <= {"ngram", "draft"}
    assert all(e.proposer == "" for e in events if isinstance(e, Token) and e.source == "target")


def test_the_policy_prefers_a_long_copy_to_the_draft_models_tokens_and_not_a_short_match():
    from specli.decode.proposers import Proposal

    policy = AdaptiveDraftPolicy(costs(draft_per_token=0.05), NGramProposer.prior, max_draft=16)
    assert policy.prefers(Proposal(list(range(16)), key=12, extent=40, proposer="ngram"), 16)
    assert not policy.prefers(Proposal([3], key=1, extent=0, proposer="ngram"), 16), "a cheap draft model is worth more"


def test_a_copy_the_runs_budget_cannot_afford_leaves_the_step_to_the_draft_model():
    """After lookup's drafts failed, the run's budget caps what lookup may draft: `prefers`
    prices the copy as `choose` would, so the draft model is asked instead of a cut-down copy."""
    from specli.decode.events import StepRecord
    from specli.decode.proposers import Proposal

    policy = AdaptiveDraftPolicy(costs(draft_per_token=0.05), NGramProposer.prior, max_draft=16)
    copy = Proposal(list(range(16)), key=12, extent=40, proposer="ngram")
    assert policy.prefers(copy, 16)
    for _ in range(3):
        policy.record(StepRecord(16, 0, 0.0, 0.0, 0.0, 0.0, 12, 40))  # long copies rejected at once
    assert policy._affordable(12, 16) == 0
    assert not policy.prefers(copy, 16)


@pytest.mark.slow  # two real models
def test_a_real_draft_model_with_lookup_equals_plain_and_reports_each_proposer(gemma_path):
    """Gemma drafting for itself (the vocabulary rule holds), lookup in front, on a prompt that copies."""
    import subprocess
    import sys

    prompt = "def add(a, b):\n    return a + b\n\n\ndef add(a, b):\n    return a + b\n\n\ndef add("
    command = [sys.executable, "-m", "specli", "run", "--json", "--target", str(gemma_path), "-n", "32", "-c", "512",
               "-k", "4", prompt]
    both = subprocess.run([*command, "--draft", str(gemma_path)], capture_output=True, text=True, timeout=300)
    plain = subprocess.run([*command, "--draft", "none"], capture_output=True, text=True, timeout=300)
    assert both.returncode == 0 and plain.returncode == 0, both.stderr + plain.stderr
    records = [json.loads(line) for line in both.stdout.splitlines()]
    plain_records = [json.loads(line) for line in plain.stdout.splitlines()]
    text = "".join(r["text"] for r in records if r["type"] == "token")
    assert text == "".join(r["text"] for r in plain_records if r["type"] == "token")
    stats = records[-1]
    assert stats["proposer"] == "draft+ngram" and stats["drafted_by"].get("ngram", 0) > 0
    assert {r.get("proposer") for r in records if r["type"] == "token" and r["source"] == "draft"} <= {"ngram", "draft"}


@pytest.mark.slow  # two real models
def test_a_copying_prompt_needs_fewer_draft_model_decodes(gemma_path):
    """Gemma drafting for itself (the synthetic pair's random weights never copy a prompt):
    with lookup in front, the copy is drafted from the text and the draft model decodes less."""
    from specli.llama.backend import LoadSettings, Model

    code = "def area(width, height):\n    return width * height\n\n\ndef perimeter(width, height):\n    return 2 * (width + height)\n"
    with Model(gemma_path, LoadSettings(ctx_size=512)) as target, Model(gemma_path, LoadSettings(ctx_size=512)) as draft:
        prompt = target.tokenize(code + "\n\n" + code + "\n\n" + code[:30])  # a copy in progress
        outputs, decoded = {}, {}
        for name in ("draft", "draft+ngram"):
            calls = []
            original = draft.decode

            def counting(tokens, **kwargs):
                calls.append(len(tokens))
                return original(tokens, **kwargs)

            draft.decode = counting
            model = DraftModelProposer(DraftModel(draft), SamplingSettings())
            proposer = model if name == "draft" else LookupThenModel(NGramProposer(), model)
            engine = Engine(target, proposer, FixedDraftPolicy(6), GenerationRequest(40))
            outputs[name] = generated(engine, prompt)[0]
            decoded[name] = len(calls)
            draft.decode = original
            target.rewind(0)
            draft.rewind(0)
    assert outputs["draft"] == outputs["draft+ngram"]
    assert decoded["draft+ngram"] < 0.8 * decoded["draft"], decoded


def test_a_draft_model_that_fell_behind_is_priced_with_its_catch_up():
    """While lookup drafted, the draft model fell behind the text: drafting with it now costs
    its catch-up too, so a long way behind, the policy takes a plain step instead (a draft
    long enough to pay for the catch-up still goes ahead)."""
    policy = AdaptiveDraftPolicy(StepCosts({1: 1.0, 2: 1.1, 4: 1.2, 8: 1.4, 16: 1.8, 32: 2.6, 49: 3.4}, 0.05, 0.02,
                                           "calibrated", draft_acceptance=0.9, draft_catch_up=0.02), max_draft=16)
    assert policy.choose(None, 0, 16, behind=0) > 4
    assert policy.choose(None, 0, 16, behind=1000) == 0, "1000 tokens to catch up cost 20 plain steps"


def test_the_draft_model_knows_how_far_behind_the_text_it_is():
    draft = FakeModel(seed=0)
    model = DraftModelProposer(DraftModel(draft), SamplingSettings())
    model.prepare(PROMPT)
    assert model.behind(PROMPT) == 0, "the prompt it owes is not counted: it is priced as decoded up front"
    assert model.behind(PROMPT + [1, 2, 3]) == 3
    model.propose(PROMPT + [1, 2, 3], 2)
    assert model.behind(PROMPT + [1, 2, 3]) == 0
    # The last committed token is decoded as the draft starts in any case: only those before it count.
    assert LookupThenModel(NGramProposer(), model).behind(PROMPT + [1, 2, 3, 9, 5]) == 1


class UpFront(DraftModel):
    """A draft model that decodes the prompt as it takes it in (as DraftModel did before it
    owed it)."""

    def prepare(self, prompt: list[int]) -> None:
        super().prepare(prompt)
        self._settle()


# Rows that cost what they cost one at a time, and a draft token as dear as a target step: a
# draft model of the target's size on a compute-bound CPU (SmolLM2 drafting for itself).
LINEAR = StepCosts({1: 1.0, 2: 2.0, 4: 4.0, 8: 8.0, 16: 16.0, 32: 32.0, 49: 49.0}, 1.0, 0.02, "calibrated",
                   draft_acceptance=1.0, draft_catch_up=0.3)


@pytest.mark.parametrize("lookup", [True, False])
def test_a_draft_model_decodes_the_prompt_only_where_it_first_drafts(lookup):
    """Owed, the prompt is decoded where the model first drafts, in the decode it had up front:
    the same decodes, drafts and text; a generation that never drafts with it decodes nothing."""
    target = FakeModel(seed=5, order=1, n_vocab=9)
    reference = plain_greedy(target, PROMPT, 40)
    drafted = {}
    for name, policy in {"cannot pay": lambda: AdaptiveDraftPolicy(LINEAR, NGramProposer.prior, max_draft=16),
                         "pays": lambda: AdaptiveDraftPolicy(costs(), NGramProposer.prior, max_draft=16),
                         "-k 4": lambda: FixedDraftPolicy(4)}.items():
        runs = {}
        for kind in (DraftModel, UpFront):
            draft = FakeModel(seed=5, order=1, n_vocab=9, noise_seed=1, noise=0.2)
            proposer = DraftModelProposer(kind(draft), SamplingSettings())
            output, stats, events = generate(LookupThenModel(NGramProposer(), proposer) if lookup else proposer,
                                             policy(), FakeModel(seed=5, order=1, n_vocab=9), max_tokens=40)
            assert output == reference
            drafts = [(e.id, e.proposer) for e in events if isinstance(e, Token) and e.source == "draft"]
            runs[kind] = (draft.batch_sizes, stats.drafted_by, drafts)
        owed, up_front = runs[DraftModel], runs[UpFront]
        assert owed[1:] == up_front[1:], f"{name}: the same drafts"
        drafted[name] = owed[1].get("draft", 0) > 0
        if drafted[name]:
            assert owed[0] == up_front[0] and owed[0][0] == len(PROMPT) - 1, f"{name}: the same decodes, the prompt first"
        else:
            assert owed[0] == [] and up_front[0] == [len(PROMPT) - 1], f"{name}: no draft, so the prompt stays owed"
    # Alone the model drafts where it pays; with lookup in front, -k auto copies this periodic text instead.
    assert drafted == ({"cannot pay": False, "pays": False, "-k 4": True} if lookup
                       else {"cannot pay": False, "pays": True, "-k 4": True})


def test_a_draft_model_keeps_what_it_holds_of_the_prompt_and_owes_the_rest():
    draft = FakeModel(seed=0)
    model = DraftModelProposer(DraftModel(draft), SamplingSettings())
    model.prepare(PROMPT[:8])
    model.propose(PROMPT[:8], 1)  # an earlier turn, drafted in
    model.prepare(PROMPT)
    assert draft.batch_sizes == [7, 1] and model.behind(PROMPT) == 0, "nothing decoded in prepare"
    drafted = model.propose(PROMPT, 2).tokens
    assert draft.batch_sizes[2:] == [len(PROMPT) - 9, 1, 1], "what it held of it is kept: the rest owed, then the draft"
    fresh = DraftModelProposer(UpFront(FakeModel(seed=0)), SamplingSettings())
    fresh.prepare(PROMPT)
    assert fresh.propose(PROMPT, 2).tokens == drafted, "the same draft as a model given the whole prompt"
    model.prepare(PROMPT[:4] + [9] * 8)
    assert model.draft.owed and model.draft.cached == PROMPT[:4]
    model.draft.forget()
    assert model.draft.owed == [] and model.behind(PROMPT) == len(PROMPT) - 1, "forgotten: nothing held, nothing owed"
