"""Drafting across vocabularies, through text: SmolLM2-135M (GPT-2 BPE, 49k tokens) drafting
for Gemma 3 270M (SentencePiece BPE, 262k tokens), and Gemma drafting for SmolLM2.

The output is the target's own (greedy: identical, or a first divergence at a near-tie, as in
test_real_models; --exact: identical; seeded: the same on every run), the draft's text is
read and written back across the two tokenizers at the hard boundaries (digits, whitespace
runs, multi-byte UTF-8, an emoji split into byte tokens), and the CLI says in one line that
it drafts through text and why.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import assert_lossless, generated

from specli.comparison import plain_greedy
from specli.decode.draft_model import DraftModel, DraftModelProposer
from specli.decode.engine import Engine
from specli.decode.ngram import NGramProposer
from specli.decode.policy import FixedDraftPolicy
from specli.decode.proposers import LookupThenModel
from specli.decode.request import DraftKind, GenerationRequest
from specli.decode.sampling import SamplingSettings
from specli.decode.translate import Spelling, TranslatedDraft, complete_utf8
from specli.llama.backend import LoadSettings

BOUNDARY_TEXTS = [
    "Order 1234567 shipped 2026-11-25 at 09:41; total 1,299.50 (3.14159).",
    "a    b\n\n\n    c\t\td  \n e",
    "naïve café, Zürich, 東京 and Ελληνικά: déjà vu.",
    "Tonight 🎉😀 we ship 🚀🚀 — ok 👍🏽!",
]


class SpacePrefixTokenizer:
    """A SentencePiece-like toy that puts a space before whatever it tokenizes, as Llama 2's
    and Mistral 7B's do: one token per character, the space a token of its own."""

    bos, add_bos, n_ctx = 1, True, 64

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return [ord(c) for c in " " + text]

    def piece(self, token: int, special: bool = False) -> bytes:
        return chr(token).encode()

    def is_end_of_generation(self, token: int) -> bool:
        return False


def test_a_tokenizer_that_adds_a_space_spells_the_text_alone():
    spelling = Spelling(SpacePrefixTokenizer())
    assert spelling.prefix == b" \n"
    assert spelling.spell(spelling.tokens("red")) == b"red"
    assert spelling.spell(spelling.tokens(" red")) == b" red"


def test_complete_utf8_holds_back_only_an_unfinished_character():
    emoji = "😀".encode()
    assert complete_utf8(b"abc") == 3
    assert complete_utf8(b"ab" + emoji) == 6
    for cut in range(1, 4):
        assert complete_utf8(b"ab" + emoji[:cut]) == 2, cut
    assert complete_utf8("é".encode()[:1]) == 0
    assert complete_utf8(b"\x80\x80") == 2, "stray continuation bytes never complete: nothing to wait for"
    assert complete_utf8(b"") == 0


def pairs(gemma_model, smollm_model):
    return [(gemma_model, smollm_model), (smollm_model, gemma_model)]


@pytest.mark.slow
@pytest.mark.parametrize("text", BOUNDARY_TEXTS)
def test_the_draft_reads_the_committed_text_token_by_token(gemma_model, smollm_model, text):
    """Fed the target's tokens one at a time, the draft's own tokens always spell the
    committed text, up to a character not yet complete; its tokenizer is only given the text
    from its last token on, and the re-tokenizing keeps all its earlier tokens but the last
    two at most (its cache is rewound only that far)."""
    for target, draft in pairs(gemma_model, smollm_model):
        bridge = TranslatedDraft(target, DraftModelProposer(DraftModel(draft), SamplingSettings(), keyed=False))
        tokenized: list[str] = []  # what the draft's tokenizer is given, call by call
        plain = bridge._read_spelling._plain
        bridge._read_spelling._plain = lambda text: tokenized.append(text) or plain(text)
        tokens = target.tokenize(text, add_special=False)
        previous: list[int] = []
        for count in range(1, len(tokens) + 1):
            read = bridge._read(tokens[:count])
            assert len(tokenized[-1]) <= 24, f"the whole text tokenized again: {tokenized[-1]!r}"
            committed = b"".join(target.piece(t) for t in tokens[:count])
            spelled = b"".join(draft.piece(t) for t in read)
            assert spelled == committed[: complete_utf8(committed)], (target.path.name, count)
            kept = next((i for i, (a, b) in enumerate(zip(previous, read)) if a != b), min(len(previous), len(read)))
            assert kept >= len(previous) - 2, "only the last tokens are tokenized again"
            previous = read


@pytest.mark.slow
@pytest.mark.parametrize("text", BOUNDARY_TEXTS)
def test_drafted_text_becomes_target_tokens_that_spell_it_but_the_last(gemma_model, smollm_model, text):
    for target, draft in pairs(gemma_model, smollm_model):
        bridge = TranslatedDraft(target, DraftModelProposer(DraftModel(draft), SamplingSettings(), keyed=False))
        data = text.encode()
        proposed = bridge._target_tokens(data)
        spelled = b"".join(target.piece(t) for t in proposed)
        assert data.startswith(spelled)
        whole = target.tokenize(text, add_special=False)
        assert proposed == whole[: len(proposed)] and len(proposed) == len(whole) - 1, "the last token is held back"
        # Drafted text that ends inside a character: only what comes before it is proposed.
        if "🎉" in text:
            cut = data[: data.index("🎉".encode()) + 2]
            assert cut[: complete_utf8(cut)].startswith(b"".join(target.piece(t) for t in bridge._target_tokens(cut)))


@pytest.mark.slow
def test_no_draft_while_the_committed_text_ends_inside_an_emoji(gemma_model, smollm_model):
    """SmolLM2 writes 😀 as two byte tokens; after the first, the text ends inside the
    character, and the draft (Gemma) cannot continue half of it: it abstains."""
    bridge = TranslatedDraft(smollm_model, DraftModelProposer(DraftModel(gemma_model), SamplingSettings(), keyed=False))
    tokens = smollm_model.tokenize("Party time 😀", add_special=False)
    assert smollm_model.piece(tokens[-1]) == b"\x80", "the emoji's last byte is a token of its own"
    bridge.prepare(tokens[:-1])
    assert bridge.propose(tokens[:-1], 4).tokens == []
    assert bridge.propose(tokens, 4).tokens, "once the character is whole it drafts again"


@pytest.mark.slow
def test_through_text_the_draft_owes_the_prompt_until_it_first_drafts(gemma_model, smollm_model, monkeypatch):
    """The draft's tokens for the prompt are decoded where it first drafts, not in prepare, and
    it drafts what it drafts when it decoded them up front; a prompt it cannot take in leaves
    nothing of the last one owed."""
    for target, draft in pairs(gemma_model, smollm_model):
        prompt = target.tokenize(GROUNDED)
        drafts = []
        for up_front in (False, True):
            model = DraftModel(draft)
            bridge = TranslatedDraft(target, DraftModelProposer(model, SamplingSettings(), keyed=False))
            decoded: list[int] = []
            decode = draft.decode
            monkeypatch.setattr(draft, "decode", lambda tokens, **kw: decoded.append(len(tokens)) or decode(tokens, **kw))
            bridge.prepare(prompt)
            owed = len(model.owed)
            if up_front:
                model._settle()
            assert decoded == ([owed] if up_front else []) and owed > 10, draft.path.name
            drafts.append(bridge.propose(prompt, 4).tokens)
            assert decoded[0] == owed and not model.owed, "the prompt first, in one decode, then the draft"
            monkeypatch.undo()
        assert drafts[0] == drafts[1] and drafts[0], f"{draft.path.name}: the same draft as up front"
        other = target.tokenize("Boats, tides and the long grey sea: a different prompt altogether.")
        bridge.prepare(other)
        assert model.owed, "another prompt: owed past what the cache holds of it"
        monkeypatch.setattr(bridge, "_fits", lambda sequence: False)
        bridge.prepare(other)
        assert model.owed == []
        monkeypatch.undo()


def generate(target, proposer, prompt, *, sampling=SamplingSettings(), seed=0, k=4, max_tokens=40):
    engine = Engine(target, proposer, FixedDraftPolicy(k), GenerationRequest(max_tokens, sampling, seed=seed))
    return generated(engine, prompt)


GROUNDED = ("The three primary colours are red, yellow and blue. Mixing red and yellow gives orange; "
            "mixing yellow and blue gives green. The three primary colours are")


@pytest.mark.slow
def test_greedy_output_is_the_targets_and_the_draft_is_kept_on_a_grounded_prompt(gemma_model, smollm_model):
    for target, draft in pairs(gemma_model, smollm_model):
        prompt = target.tokenize(GROUNDED)
        plain, margins = plain_greedy(target, prompt, 40)
        for k in (2, 6):
            proposer = TranslatedDraft(target, DraftModelProposer(DraftModel(draft), SamplingSettings(), keyed=False))
            output, stats = generate(target, proposer, prompt, k=k)
            assert_lossless(plain, margins, output)
            assert stats.translated and stats.drafted > 0
            assert stats.accepted > 0, f"{draft.path.name} drafting for {target.path.name}: nothing kept"


@pytest.mark.slow
def test_seeded_output_repeats_with_lookup_in_front(gemma_model, smollm_model):
    sampling = SamplingSettings(temperature=0.8, top_k=40)
    for target, draft in pairs(gemma_model, smollm_model):
        prompt = target.tokenize(GROUNDED)
        runs = []
        for _ in range(2):
            proposer = LookupThenModel(NGramProposer(),
                                       TranslatedDraft(target, DraftModelProposer(DraftModel(draft), sampling, seed=7, keyed=False)))
            runs.append(generate(target, proposer, prompt, sampling=sampling, seed=7))
        assert runs[0][0] == runs[1][0], "the same seed writes the same text"
        assert runs[0][1].translated and runs[0][1].drafted > 0


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specli", "run", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("direction", ["smollm drafts for gemma", "gemma drafts for smollm"])
def test_the_cli_drafts_through_text_says_why_and_exact_is_bit_for_bit(gemma_path, smollm_path, direction):
    target, draft = (gemma_path, smollm_path) if direction.startswith("smollm") else (smollm_path, gemma_path)
    common = ["--target", str(target), "--no-chat", "-n", "24", "-c", "512", "--temp", "0"]
    exact_plain = cli(*common, "--draft", "none", "--exact", GROUNDED)
    exact_draft = cli(*common, "--draft", str(draft), "--exact", "-k", "4", GROUNDED)
    assert exact_plain.returncode == 0 and exact_draft.returncode == 0, exact_draft.stderr
    assert exact_draft.stdout == exact_plain.stdout, "--exact: the same text whatever the draft"
    # Sampled: the target's own keyed draws, so the text plain decoding samples with that seed
    # (a verify that kept a draft token the target did not draw would write another).
    seeded = [*common[:-2], "--temp", "0.8", "--seed", "7", "--exact"]
    sampled_plain = cli(*seeded, "--draft", "none", "--json", GROUNDED)
    sampled_draft = cli(*seeded, "--draft", str(draft), "-k", "4", "--json", GROUNDED)
    assert sampled_plain.returncode == 0 and sampled_draft.returncode == 0, sampled_draft.stderr
    plain_records, draft_records = ([json.loads(line) for line in run.stdout.splitlines()]
                                    for run in (sampled_plain, sampled_draft))
    assert [r["id"] for r in draft_records if r["type"] == "token"] == \
        [r["id"] for r in plain_records if r["type"] == "token"]
    assert draft_records[-1]["drafted"] > 0
    notes = [line for line in exact_draft.stderr.splitlines() if "drafting through text" in line]
    assert len(notes) == 1 and "use different tokenizers" in notes[0], exact_draft.stderr
    as_json = cli(*common, "--draft", str(draft), "-k", "4", "--json", GROUNDED)
    assert as_json.returncode == 0, as_json.stderr
    stats = json.loads(as_json.stdout.strip().splitlines()[-1])
    assert stats["type"] == "stats" and stats["translated"] is True and stats["drafted"] > 0
    shown = cli(*common, "--draft", str(draft), "-k", "4", GROUNDED)
    assert "draft+ngram through text: drafted" in shown.stderr, "the stats line says the pair is translated"


@pytest.mark.slow
def test_a_translated_drafts_catch_up_is_priced_per_draft_token(gemma_path, smollm_path, monkeypatch):
    """Proposer.behind counts the draft's own tokens, so its catch-up cost is stored per draft
    token as timed; a drafted token is priced per target token (the tokenizers' ratio)."""
    from specli import pricing
    from specli.decode.costs import Calibration
    from specli.decode.translate import cost_per_target_token
    from specli.session import SessionSpec, open_session

    timings = {1: 0.010, pricing.CATCH_UP_BATCH: 0.048}
    monkeypatch.setattr(pricing, "calibrate",
                        lambda decode, rewind, token, sizes, **_: Calibration(timings, None, 0.0, None))
    spec = SessionSpec(gemma_path, smollm_path, LoadSettings(ctx_size=64), LoadSettings(ctx_size=64))
    with open_session(spec) as opened:
        assert opened.loaded[DraftKind.MODEL].through_text
        draft = opened.loaded[DraftKind.MODEL].model
        # (the round trip through both tokenizers is timed each time: a little noise)
        assert opened.pricing.calibrate_drafter(opened.pricing.drafter("model")) == pytest.approx(cost_per_target_token(opened.target, draft, 0.010),
                                                                 rel=0.02)
        catch_up = opened.pricing.store.get(opened.pricing.drafter("model").key.beside("catch_up"))
        assert catch_up == pytest.approx(0.048 / pricing.CATCH_UP_BATCH)
