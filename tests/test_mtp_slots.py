"""The target's NextN layer drafting in several sequences at once (decode/slots.py,
decode/mtp.py's NextnSlot, specli.llama.mtp's MtpHeads of as many sequences): every slot's
drafting entries in one MTP decode a draft position, each read with its own sequence's hidden
rows, on the tiny MiMo-2 and Qwen3.5 of tests/support/synthetic_mtp.py."""

from __future__ import annotations

import pytest
from helpers import SIDE_BY_SIDE, assert_lossless, plain_with_margins

from specli import drafts
from specli.decode.request import GenerationRequest
from specli.llama.backend import LoadSettings, Model
from specli.parallel import Job, run_jobs
from specli.session import SessionSpec, open_session

pytestmark = pytest.mark.slow  # loads models

PROMPTS = SIDE_BY_SIDE
N = 48


def mtp_session(path, sequences: int):
    return open_session(SessionSpec(path, loads=("mtp",), target_load=LoadSettings(
        ctx_size=512, threads=1, sequences=sequences, recurrent_snapshots=3)))


def drafted(path, sequences: int, k: int):
    """Each prompt's generation with MTP -k k (no lookup), `sequences` at once; and every MTP
    decode's parts' lengths."""
    with mtp_session(path, sequences) as session:
        widths: list[list[int]] = []
        if session.slots:
            heads = session.loaded["mtp"].heads
            decode = heads.decode_sequences
            heads.decode_sequences = lambda parts: (widths.append([len(part[2]) for part in parts]), decode(parts))[1]
        request = GenerationRequest(max_tokens=N, draft="mtp", lookup=False, draft_tokens=k, seed=0)
        done = {d.index: d for d in run_jobs(session, [Job(session.target.tokenize(p), request) for p in PROMPTS])}
    assert all(d.error is None for d in done.values()), [d.error for d in done.values()]
    return [done[i].outcome for i in range(len(PROMPTS))], widths


def plain(path):
    model = Model(path, LoadSettings(ctx_size=512, threads=1, recurrent_snapshots=0))
    try:
        return [plain_with_margins(model, model.tokenize(prompt), N) for prompt in PROMPTS]
    finally:
        model.close()


@pytest.mark.parametrize("name", ["one", "hybrid"])
def test_every_slot_drafts_with_the_nextn_layer_in_one_decode_a_position(mtp_files, name):
    """Four generations side by side draft with the NextN layer as each would alone (the same
    drafts made and kept), write the target's text, and their drafting entries share MTP
    decodes: one a draft position across the slots."""
    path = mtp_files[name]
    alone, _ = drafted(path, 1, 3)
    side_by_side, widths = drafted(path, 4, 3)
    for (tokens, margins), outcome in zip(plain(path), side_by_side):
        assert_lossless(tokens, margins, outcome.tokens)
        assert outcome.stats.proposer == "mtp" and outcome.stats.accepted > 10
    assert [(o.stats.drafted, o.stats.accepted) for o in side_by_side] == \
        [(o.stats.drafted, o.stats.accepted) for o in alone]
    entries = [width for width in widths if all(length == 1 for length in width)]  # drafting, not catch-ups
    assert max(len(width) for width in entries) == 4, "the four slots' entries in one decode"
    drafting = sum(o.stats.steps for o in side_by_side if o.stats.drafted)
    assert sum(map(len, entries)) > len(entries) and len(entries) < drafting


def test_each_slot_reads_its_own_sequences_hidden_rows(mtp_files):
    """The wiring head drafts right only from the target's state of its own sequence at the
    position before: side by side it keeps as many drafts as alone, most of them (rows of
    another sequence, or shifted, keep none: tests/test_mtp.py)."""
    alone, _ = drafted(mtp_files["wiring"], 1, 1)
    side_by_side, _ = drafted(mtp_files["wiring"], 4, 1)
    for one, four in zip(alone, side_by_side):
        assert four.stats.accepted == one.stats.accepted >= 0.7 * four.stats.drafted > 0


def test_chained_nextn_layers_draft_in_one_sequence_only_and_say_so(mtp_files):
    """Chained layers (a context each) do not draft beside others: the session says why, and
    --parallel above 1 drafts with n-gram lookup instead (options.drafting_alone)."""
    from specli.commands.options import drafting_alone

    kind = drafts.KINDS["mtp"]
    with mtp_session(mtp_files["chained"], 2) as session:
        assert "one sequence only" in session.unavailable(kind)
    with mtp_session(mtp_files["one"], 2) as session:
        assert session.unavailable(kind) is None
    assert drafting_alone(SessionSpec(mtp_files["chained"], loads=("mtp",))) == ["mtp"]
    assert drafting_alone(SessionSpec(mtp_files["one"], loads=("mtp",))) == []


def test_a_server_on_a_target_with_one_nextn_layer_drafts_with_it_in_its_four_slots(mtp_files):
    """`serve` on such a target: four slots by default (llama-server's), and requests that ask
    for MTP side by side each draft with it, their kept spans marked as its."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx
    from helpers import serving

    with serving("--target", mtp_files["one"], "-c", "512") as server:
        url = server.url.removesuffix("/v1")

        def ask(prompt: str) -> dict:
            return httpx.post(url + "/v1/completions", timeout=60, json={
                "prompt": prompt, "max_tokens": 32, "temperature": 0, "draft": "mtp", "draft_tokens": 3}).json()

        with ThreadPoolExecutor(3) as pool:
            answers = list(pool.map(ask, PROMPTS[:3]))
        health = httpx.get(url + "/health", timeout=30).json()
    assert health["slots_idle"] == 4
    for answer in answers:
        assert answer["timings"]["draft_n_accepted"] > 0
        assert any(span["source"] == "draft" and span["proposer"] == "mtp" for span in answer["choices"][0]["spans"])
    assert not any("one sequence only" in line for line in server.log), server.log
