"""A hybrid target (the tiny Qwen3.5 of tests/support/synthetic_mtp.py: three gated-delta-net
layers, one attention) in several sequences at once (decode/slots.py): each sequence's state
taken back from its own snapshots after a rejected draft while others decode beside it, its own
checkpoints for a conversation, and an exact request alone among them."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import SIDE_BY_SIDE, assert_lossless, plain_with_margins
from typer.testing import CliRunner

from specli.commands.cli import app
from specli.decode.request import GenerationRequest
from specli.llama.backend import CHECKPOINT_TAIL, STATE_CHECKPOINTS, LoadSettings, Model
from specli.parallel import Job, run_jobs
from specli.session import SessionSpec, open_session

pytestmark = pytest.mark.slow  # loads models

PROMPTS = SIDE_BY_SIDE
N = 48


@pytest.fixture(scope="module")
def plain(mtp_files):
    """Each prompt's greedy tokens one at a time on a one-sequence load, with their margins."""
    model = Model(mtp_files["hybrid"], LoadSettings(ctx_size=512, threads=1, recurrent_snapshots=0))
    try:
        yield model, [plain_with_margins(model, model.tokenize(prompt), N) for prompt in PROMPTS]
    finally:
        model.close()


def slots_session(path, sequences: int = 4, snapshots: int = 3, checkpoints: int = 0):
    return open_session(SessionSpec(path, checkpoints=checkpoints, target_load=LoadSettings(
        ctx_size=512, threads=1, sequences=sequences, recurrent_snapshots=snapshots)))


def predictions(model: Model, references) -> list[str]:
    """Each answer as a prediction with two tokens swapped (the 21st and 22nd): lookup drafts it
    from the first token, a verify rejects at the swap, and the drafts realign after it."""
    out = []
    for tokens, _ in references:
        wrong = list(tokens)
        wrong[20], wrong[21] = wrong[21], wrong[20]
        out.append(b"".join(map(model.piece, wrong)).decode("utf-8", "replace"))
    return out


def test_side_by_side_each_sequence_takes_its_own_rejected_drafts_back(mtp_files, plain):
    """Four generations in one decode a step, each drafting from its prediction: a rejection in
    one sequence restores that sequence's snapshot while the others' rows sit in the same batch,
    and every text is the target's (up to near-ties: llama.cpp splits a mixed batch of a
    recurrent model into ubatches of equal length per sequence)."""
    model, references = plain
    with slots_session(mtp_files["hybrid"]) as session:
        assert session.target.max_rewind == 3 and len(session.slots) == 4
        steps = session.slots[0].steps
        forgotten: list[tuple[int, int]] = []
        forget = session.target.forget
        session.target.forget = lambda sequence, n_keep: (forgotten.append((sequence, n_keep)), forget(sequence, n_keep))
        jobs = [Job(session.target.tokenize(prompt), GenerationRequest(max_tokens=N, draft="ngram", draft_tokens=3,
                                                                         seed=0, prediction=prediction))
                for prompt, prediction in zip(PROMPTS, predictions(model, references))]
        done = {d.index: d for d in run_jobs(session, jobs)}
    assert all(d.error is None for d in done.values()), [d.error for d in done.values()]
    for index, (tokens, margins) in enumerate(references):
        assert_lossless(tokens, margins, done[index].outcome.tokens)
        stats = done[index].outcome.stats
        assert stats.accepted > 10 and stats.drafted > stats.accepted, "drafts kept, and one rejected"
    rewound = {sequence for sequence, n_keep in forgotten if n_keep > 0}
    assert rewound == {0, 1, 2, 3}, "each sequence took a rejected draft back from its snapshots"
    assert steps.rows / steps.steps > 4, "the sequences' rows went into shared decodes"


def test_a_sequence_alone_computes_what_a_one_sequence_load_does(mtp_files, plain):
    """Alone in its batch, a sequence's rows are a one-sequence load's, bit for bit: the same
    ubatches, whichever sequence holds the state."""
    model, _ = plain
    prompt = model.tokenize(PROMPTS[0])
    model.rewind(0)
    expected = [np.array(model.decode(prompt)[0]), np.array(model.decode([5, 6, 7], all_logits=True))]
    with slots_session(mtp_files["hybrid"], snapshots=0) as session:
        target = session.target
        for sequence in (0, 2):
            (first,) = target.decode_sequences([(sequence, 0, prompt, [False] * (len(prompt) - 1) + [True])])
            assert np.array_equal(first[0], expected[0]), sequence
            (rows,) = target.decode_sequences([(sequence, len(prompt), [5, 6, 7], [True] * 3)])
            assert np.array_equal(rows, expected[1]), sequence
            target.forget(sequence, 0)


def test_a_conversation_in_a_slot_decodes_on_from_its_checkpoint(mtp_files, plain):
    """A slot keeps its sequence's state checkpoints (chat and serve ask for them): a later
    prompt that parts from the cache inside the last answer restores the checkpoint taken before
    the end of its prompt and decodes only what follows, while another slot runs; without
    checkpoints the sequence empties and the prompt decodes whole. The text is the target's."""
    model, _ = plain
    first = model.tokenize("The quick brown fox jumps over the lazy dog. " * 4)
    second = first + model.tokenize(" And then the dog woke up and", add_special=False)
    reference, margins = plain_with_margins(model, second, 24)
    request = GenerationRequest(max_tokens=24, draft="ngram", draft_tokens=3, seed=0)
    other = Job(model.tokenize(PROMPTS[2]), request)
    cached = {}
    for checkpoints in (STATE_CHECKPOINTS, 0):
        with slots_session(mtp_files["hybrid"], sequences=2, checkpoints=checkpoints) as session:
            (turn,) = run_jobs(session, [Job(first, request)])
            assert session.target.checkpoint_positions(0) == ([len(first) - CHECKPOINT_TAIL] if checkpoints else [])
            done = {d.index: d for d in run_jobs(session, [Job(second, request), other])}
            assert turn.error is None and all(d.error is None for d in done.values())
            cached[checkpoints] = done[0].outcome.stats.prompt_cached
            assert_lossless(reference, margins, done[0].outcome.tokens)
    assert cached == {STATE_CHECKPOINTS: len(first) - CHECKPOINT_TAIL, 0: 0}


def test_an_exact_request_among_others_writes_plain_decodings_tokens(mtp_files, plain):
    """An exact request runs alone, on an emptied cache: bit for bit the one-token decoding of a
    one-sequence load, near-ties too, while drafted requests ran before and after it."""
    model, references = plain
    exact = GenerationRequest(max_tokens=N, draft="ngram", draft_tokens=3, exact=True, seed=0)
    other = GenerationRequest(max_tokens=N, draft="ngram", draft_tokens=3, seed=0)
    with slots_session(mtp_files["hybrid"]) as session:
        jobs = [Job(session.target.tokenize(prompt), exact if i % 2 == 0 else other) for i, prompt in enumerate(PROMPTS)]
        done = {d.index: d for d in run_jobs(session, jobs)}
    assert all(d.error is None for d in done.values())
    for index in (0, 2):
        assert done[index].outcome.tokens == references[index][0]


def test_run_batch_on_a_hybrid_target_runs_four_at_once(mtp_files, tmp_path):
    """`run --batch` on a hybrid target: four at once by default (llama-server's), each record
    the text one at a time writes."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    args = ["run", "--target", str(mtp_files["hybrid"]), "--batch", str(prompts), "-c", "256", "-t", "1",
            "--temp", "0", "-n", "24", "--draft", "ngram", "-k", "3"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(records) == len(PROMPTS) and all("text" in record for record in records)
    assert "4 at a time" in result.stderr
    alone = CliRunner().invoke(app, [*args, "--parallel", "1"])
    assert alone.exit_code == 0, alone.output
    # (one at a time, each prompt decoded whole: run's text; four at once, the same here)
    assert [r["text"] for r in records] == [json.loads(line)["text"] for line in alone.stdout.splitlines()]
