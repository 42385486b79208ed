"""Several generations in one target's sequences, one decode a step (decode/slots.py,
specli/parallel.py): the lock step on a stand-in model, then the real thing on Gemma."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from helpers import assert_lossless, plain_with_margins
from specli.decode.costs import VerifyCurve
from specli.decode.request import GenerationRequest
from specli.decode.slots import SharedSteps, Slot, draft_slots, open_slots

# --- the lock step, on a stand-in model -----------------------------------------------------


class Recorder:
    """A SequenceModel that records each decode's parts and answers a row per output."""

    sequences, n_ctx, batch_size, n_vocab = 3, 64, 16, 4
    max_rewind = None  # an attention cache: any rewind
    n_swa = 0

    def __init__(self, fail_on: int | None = None) -> None:
        self.decodes: list[list[tuple[int, int, int]]] = []  # (sequence, first position, rows) per part
        self.forgotten: list[tuple[int, int]] = []
        self.shared: list[tuple[int, int, int]] = []  # (source, sequence, positions)
        self.fail_on = fail_on

    def share(self, source: int, sequence: int, n: int) -> None:
        self.shared.append((source, sequence, n))

    def decode_sequences(self, parts):
        self.decodes.append([(sequence, first, len(tokens)) for sequence, first, tokens, _ in parts])
        if self.fail_on is not None and any(sequence == self.fail_on for sequence, *_ in parts):
            raise RuntimeError("decode failed")
        return [np.full((sum(map(bool, outputs)), self.n_vocab), float(sequence)) for sequence, _, _, outputs in parts]

    def forget(self, sequence: int, n_keep: int) -> None:
        self.forgotten.append((sequence, n_keep))


def in_threads(*work):
    errors: list[BaseException] = []

    def guarded(job):
        try:
            job()
        except BaseException as error:  # noqa: BLE001 (the test reads it)
            errors.append(error)

    threads = [threading.Thread(target=guarded, args=(job,)) for job in work]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
        assert not thread.is_alive(), "a slot never got its rows"
    return errors


def test_running_slots_share_each_decode_and_get_their_own_rows():
    model = Recorder()
    slots = open_slots(model)
    started = threading.Barrier(3)
    got: dict[int, list[float]] = {}

    def generation(slot: Slot) -> None:
        with slot.running():
            started.wait()  # all three run before anyone decodes
            rows = [slot.decode([1, 2, 3])[0, 0]]
            for _ in range(4):
                rows.append(slot.decode([5], all_logits=True)[0, 0])
            got[slot.sequence] = rows

    assert in_threads(*(lambda slot=slot: generation(slot) for slot in slots)) == []
    assert got == {sequence: [float(sequence)] * 5 for sequence in range(3)}
    assert len(model.decodes) == 5  # a prompt step and four one-row steps, every sequence in each
    assert all(sorted(sequence for sequence, *_ in parts) == [0, 1, 2] for parts in model.decodes)
    assert [slot.n_past for slot in slots] == [7, 7, 7]
    slots[0].steps.close()


def test_a_slot_that_is_not_running_is_not_waited_for_and_a_long_prompt_goes_in_chunks(monkeypatch):
    monkeypatch.setattr("specli.decode.slots.PREFILL_CHUNK", 4)
    model = Recorder()
    slots = open_slots(model)
    both = threading.Barrier(2)

    seen: list[tuple[int, float]] = []

    def short(slot: Slot) -> None:
        with slot.running():
            both.wait()
            for _ in range(3):
                slot.decode([7])
                seen.append(slot.others())

    def long(slot: Slot) -> None:
        with slot.running():
            both.wait()
            slot.decode(list(range(10)))  # 4 + 4 + 2 rows, a chunk a step beside the other

    assert in_threads(lambda: short(slots[0]), lambda: long(slots[1])) == []
    chunks = [rows for parts in model.decodes for sequence, _, rows in parts if sequence == 1]
    assert chunks == [4, 4, 2] and slots[1].n_past == 10
    # What the other's chunks stand for beside it: the one row it will decode a step, not 4.
    assert [rows for rows, _ in seen] == [1, 1, 1]
    # Slot 2 never ran: every step went ahead without it.
    assert all(sequence != 2 for parts in model.decodes for sequence, *_ in parts)
    slots[0].steps.close()


def test_a_failed_decode_fails_the_slots_in_it_and_rewinds_are_their_own():
    model = Recorder(fail_on=1)
    slots = open_slots(model)
    both = threading.Barrier(2)

    def generation(slot: Slot) -> None:
        with slot.running():
            both.wait()
            slot.decode([1, 2])
            slot.rewind(1)

    errors = in_threads(lambda: generation(slots[0]), lambda: generation(slots[1]))
    assert [str(error) for error in errors] == ["decode failed", "decode failed"]  # they were in one decode
    slot = slots[2]
    with slot.running():
        slot.decode([1, 2, 3])
        slot.rewind(1)
    assert model.forgotten == [(2, 1)] and slot.n_past == 1
    slots[0].steps.close()


def test_an_exclusive_slot_runs_alone_on_an_emptied_cache():
    model = Recorder()
    slots = open_slots(model)
    steps: SharedSteps = slots[0].steps
    first_running = threading.Event()
    release = threading.Event()

    def other() -> None:
        with slots[0].running():
            slots[0].decode([1, 2])
            first_running.set()
            release.wait(10)
            slots[0].decode([3])

    def alone() -> None:
        first_running.wait(10)
        with slots[1].running(exclusive=True):
            assert steps.running == 1
            slots[1].decode([4, 5])
            slots[1].decode([6])

    def release_soon() -> None:
        first_running.wait(10)
        release.set()

    assert in_threads(other, alone, release_soon) == []
    exclusive = [parts for parts in model.decodes if any(sequence == 1 for sequence, *_ in parts)]
    assert exclusive == [[(1, 0, 2)], [(1, 2, 1)]]  # alone in its decodes, from position 0
    assert (0, 0) in model.forgotten and slots[0].n_past == 0  # the other sequence forgotten first
    steps.close()


def test_a_prompt_starts_from_the_longest_prefix_any_sequence_holds_as_its_cells_stand_now():
    model = Recorder()
    slots = open_slots(model)
    steps: SharedSteps = slots[0].steps
    with slots[0].running():
        slots[0].decode([1, 2, 3, 4, 5, 6])
        slots[0].decode([7, 8], all_logits=True)  # a verify batch: its rows are cells too
        slots[0].rewind(7)  # the last drafted token rejected: its cell is gone
        # Slot 1 borrows while slot 0 runs: what slot 0 holds now, not what it once held.
        slots[1].borrow([1, 2, 3, 4, 5, 6, 7, 8, 9])
        assert model.shared == [(0, 1, 7)] and (1, 0) in model.forgotten
        assert slots[1].n_past == 7 and slots[1].cache.tokens == [1, 2, 3, 4, 5, 6, 7]
        slots[0].decode([9])
    # A prompt no sequence holds more of than the slot itself: nothing shared.
    slots[1].cache.tokens = [1, 2, 3, 4, 5, 6, 7]
    slots[1].borrow([1, 2, 3, 4, 5, 6, 7, 10])
    assert len(model.shared) == 1
    # A sliding window the source reached: its first cells may be gone, so nothing is lent.
    model.n_swa = 7  # (slot 0 has held 9 positions, slot 1 7)
    slots[2].borrow([1, 2, 3, 4])
    assert len(model.shared) == 1 and slots[2].n_past == 0
    model.n_swa = 0
    # A failed decode's positions are not lent.
    model.fail_on = 0
    with slots[0].running():
        slots[0].rewind(3)
        with pytest.raises(RuntimeError):
            slots[0].decode([30, 31])
    model.fail_on = None
    slots[2].borrow([1, 2, 3, 30, 31])
    assert model.shared[-1] == (0, 2, 3) and slots[2].n_past == 3
    # Where lending is off (a recurrent target, the target's NextN layers), nothing is shared.
    steps.lend = False
    slots[2].borrow([1, 2, 3, 4, 5, 6, 7])
    assert len(model.shared) == 2
    steps.close()


def test_a_prompt_that_begins_as_one_being_decoded_waits_for_it_then_shares_its_cells():
    class Slow(Recorder):
        def decode_sequences(self, parts):
            time.sleep(0.3)
            return super().decode_sequences(parts)

    model = Slow()
    slots = open_slots(model)
    opening = list(range(10, 40))
    waited = {}

    def first() -> None:
        slots[0].borrow(opening + [1])
        time.sleep(0.2)  # (its engine is being built)
        with slots[0].running():
            slots[0].decode(opening + [1])
            slots[0].decode([2])

    def second() -> None:
        time.sleep(0.05)  # it comes before the first's prompt is decoded
        started = time.monotonic()
        slots[1].borrow(opening + [3])
        waited["seconds"], waited["held"] = time.monotonic() - started, slots[1].n_past

    assert in_threads(first, second) == []
    assert waited["held"] == len(opening) and model.shared == [(0, 1, len(opening))]
    # A prompt whose generation never starts is waited for no longer than COMING_GRACE.
    slots[2].borrow([50] * 20)
    started = time.monotonic()
    slots[1].borrow([50] * 10 + [4])
    assert len(model.shared) == 1 and 0.3 < time.monotonic() - started < 2
    slots[0].steps.close()


def test_a_draft_model_drafts_for_every_slot_in_one_decode_a_position():
    target, draft = Recorder(), Recorder()
    slots = open_slots(target)
    drafting = draft_slots(slots, draft)
    started = threading.Barrier(3)

    def generation(index: int, k: int) -> None:
        slot, drafter = slots[index], drafting[index]
        with slot.running():
            started.wait()
            for step in range(2):
                drafter.decode([1, 2] if step == 0 else [3])  # a catch-up, and the first draft row
                for _ in range(k - 1):
                    drafter.decode([4])  # each further drafted token
                drafter.rewind(drafter.n_past - (k - 1))
                slot.decode([5] * (k + 1), all_logits=True)  # [last] + the draft, verified

    assert in_threads(*(lambda index=index, k=k: generation(index, k) for index, k in enumerate((3, 1, 2)))) == []
    # The draft model's decodes: every slot's catch-up in one, then the slots still drafting
    # together, and the target's steps each with every slot's rows.
    assert draft.decodes == [[(0, 0, 2), (1, 0, 2), (2, 0, 2)], [(0, 2, 1), (2, 2, 1)], [(0, 3, 1)],
                             [(0, 2, 1), (1, 2, 1), (2, 2, 1)], [(0, 3, 1), (2, 3, 1)], [(0, 4, 1)]]
    assert [len(parts) for parts in target.decodes] == [3, 3]
    assert slots[0].steps.draft_steps == 6 and slots[0].steps.draft_rows == 15
    assert sorted(draft.forgotten) == [(0, 2), (0, 3), (2, 2), (2, 3)]  # each its own rewinds
    slots[0].steps.close()


# --- on Gemma: four generations at once ------------------------------------------------------

PROMPTS = [
    "The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "Once upon a time there was a little fox who lived in the forest. Every day the fox",
    "List three colours: red, green, blue. List three colours again: red,",
    "1, 2, 3, 4, 5, 6, 7, 8,",
]
MAX_TOKENS = 32


@pytest.fixture(scope="module")
def parallel_session(gemma_path):
    from specli.llama.backend import LoadSettings
    from specli.session import SessionSpec, open_session

    with open_session(SessionSpec(gemma_path, target_load=LoadSettings(ctx_size=512, sequences=4))) as session:
        yield session


def _plain(gemma_model, prompt):
    """One token at a time on a one-sequence context, with each step's top-two margin."""
    return plain_with_margins(gemma_model, gemma_model.tokenize(prompt), MAX_TOKENS)


@pytest.mark.slow
@pytest.mark.parametrize("draft,k", [("none", 1), ("ngram", 4), ("ngram", "auto")])
def test_generations_side_by_side_write_the_targets_text(gemma_model, parallel_session, draft, k):
    from specli.parallel import Job, run_jobs

    session = parallel_session
    kw = {} if k == "auto" else {"draft_tokens": k}
    request = GenerationRequest(max_tokens=MAX_TOKENS, draft=draft, seed=0, **kw)
    jobs = [Job(session.target.tokenize(prompt), request) for prompt in PROMPTS]
    steps = session.slots[0].steps
    before = (steps.steps, steps.rows)
    done = {d.index: d for d in run_jobs(session, jobs)}
    assert sorted(done) == list(range(len(PROMPTS))) and all(d.error is None for d in done.values())
    for index, prompt in enumerate(PROMPTS):
        plain, margins = _plain(gemma_model, prompt)
        output = done[index].outcome.tokens
        assert_lossless(plain, margins, output)
        assert done[index].outcome.stats.tokens == len(output)
    decodes, rows = steps.steps - before[0], steps.rows - before[1]
    tokens = sum(d.outcome.stats.tokens for d in done.values())
    # Side by side: fewer decodes than one a token, and more rows than one a decode.
    assert decodes < tokens and rows / decodes > 2
    if draft == "ngram":
        assert sum(d.outcome.stats.accepted for d in done.values()) > 0


@pytest.mark.slow
def test_a_generation_alone_in_a_slot_writes_the_one_sequence_text(gemma_session, parallel_session):
    from specli.parallel import Job, run_jobs

    request = GenerationRequest(max_tokens=MAX_TOKENS, draft="ngram", draft_tokens=3, seed=0)
    from specli.parallel import Quiet
    from specli.stream import stream

    for prompt in PROMPTS[:3]:
        tokens = gemma_session.target.tokenize(prompt)
        gemma_session.clear_cache()
        alone = stream(gemma_session.engine_for(request), tokens, Quiet()).tokens
        (done,) = run_jobs(parallel_session, [Job(tokens, request)])
        assert done.outcome.tokens == alone


@pytest.mark.slow
def test_a_prompt_that_begins_as_a_running_ones_does_starts_from_its_cells(gemma_model, parallel_session):
    """Two prompts with one long opening: the second, in another slot, starts while the first
    generates, takes the first's cells of that opening and decodes only the rest, and writes
    the target's text for its whole prompt."""
    from specli.parallel import Quiet
    from specli.stream import stream

    session = parallel_session
    opening = "Instructions: answer in one short sentence, plainly, without lists.\n" * 3
    first, second = (session.target.tokenize(opening + ask) for ask in ("Question: what is rain?\nAnswer:",
                                                                        "Question: what is snow?\nAnswer:"))
    shared = next(i for i, (a, b) in enumerate(zip(first, second)) if a != b)
    assert shared > 40
    request = GenerationRequest(max_tokens=MAX_TOKENS, draft="ngram", seed=0)
    one, two = session.slots[:2]
    for slot in session.slots:
        slot.rewind(0)
    answering = threading.Event()

    class Answering(Quiet):
        def token(self, event) -> None:
            answering.set()

    def generate_first() -> None:
        with one.running():
            stream(session.engine_for(request, slot=one), first, Answering())

    got = {}

    def generate_second() -> None:
        answering.wait(60)  # the first's prompt is in: it generates
        two.borrow(second)
        got["held"] = two.n_past
        with two.running():
            got["outcome"] = stream(session.engine_for(request, slot=two), second, Quiet())

    assert in_threads(generate_first, generate_second) == []
    outcome = got["outcome"]
    assert got["held"] == shared and outcome.stats.prompt_cached == shared
    plain, margins = plain_with_margins(gemma_model, second, MAX_TOKENS)
    assert_lossless(plain, margins, outcome.tokens)


@pytest.mark.slow
def test_exact_requests_among_others_write_plain_decodings_tokens(gemma_model, parallel_session):
    from specli.parallel import Job, run_jobs

    exact = GenerationRequest(max_tokens=MAX_TOKENS, draft="ngram", draft_tokens=4, exact=True, seed=0)
    other = GenerationRequest(max_tokens=MAX_TOKENS, draft="ngram", draft_tokens=4, seed=0)
    jobs = [Job(parallel_session.target.tokenize(prompt), exact if i % 2 == 0 else other)
            for i, prompt in enumerate(PROMPTS)]
    done = {d.index: d for d in run_jobs(parallel_session, jobs)}
    for index in range(0, len(PROMPTS), 2):
        assert done[index].error is None
        assert done[index].outcome.tokens == _plain(gemma_model, PROMPTS[index])[0]  # bit for bit, near-ties too
    assert all(done[index].error is None for index in range(1, len(PROMPTS), 2))


# --- a draft model beside others: one draft decode a position across the slots ---------------


def _drafted_side_by_side(session, plain_model, prompts, request):
    from specli.parallel import Job, run_jobs

    steps = session.slots[0].steps
    before = (steps.draft_steps, steps.draft_rows)
    decode, widths = steps.draft.decode_sequences, []

    def spied(parts):
        widths.append(len(parts))
        return decode(parts)

    steps.draft.decode_sequences = spied  # (on the instance: the session's draft model alone)
    jobs = [Job(session.target.tokenize(prompt), request) for prompt in prompts]
    done = {d.index: d for d in run_jobs(session, jobs)}
    assert sorted(done) == list(range(len(prompts))) and all(d.error is None for d in done.values())
    for index, prompt in enumerate(prompts):
        plain, margins = plain_with_margins(plain_model, plain_model.tokenize(prompt), MAX_TOKENS)
        if plain_model.is_end_of_generation(plain[-1]):
            plain = plain[:-1]  # (a generation's tokens end before it)
        assert_lossless(plain, margins, done[index].outcome.tokens)
    stats = [d.outcome.stats for d in done.values()]
    assert all(s.proposer == "draft" for s in stats) and sum(s.accepted for s in stats) > 0
    decodes, rows = steps.draft_steps - before[0], steps.draft_rows - before[1]
    assert len(widths) == decodes and max(widths) == min(len(prompts), len(session.slots))  # all in one
    return decodes, rows, stats


@pytest.mark.slow
def test_a_draft_model_drafts_for_every_slot_and_the_text_stays_the_targets(smollm_path, smollm_model):
    """SmolLM2 drafting for itself in 4 slots: one draft decode carries several slots' rows."""
    from specli.llama.backend import LoadSettings
    from specli.session import SessionSpec, open_session

    load = LoadSettings(ctx_size=512, sequences=4)
    request = GenerationRequest(max_tokens=MAX_TOKENS, draft="model", draft_tokens=3, lookup=False, seed=0)
    with open_session(SessionSpec(smollm_path, draft_model=smollm_path, target_load=load, draft_load=load)) as session:
        decodes, rows, stats = _drafted_side_by_side(session, smollm_model, PROMPTS, request)
    # Request after request, each drafted token would take a draft decode of its own (and each
    # prompt one more); side by side one decode serves several slots (49 for 105 tokens, here).
    drafted = sum(s.drafted for s in stats)
    assert 0 < decodes * 1.5 < drafted and rows > decodes


@pytest.mark.slow
def test_a_draft_model_of_another_vocabulary_drafts_through_text_beside_others(gemma_path, smollm_path,
                                                                             gemma_model):
    """Gemma drafted by SmolLM2 through text, two at once: still Gemma's text."""
    from specli.llama.backend import LoadSettings
    from specli.session import SessionSpec, open_session

    load = LoadSettings(ctx_size=512, sequences=2)
    request = GenerationRequest(max_tokens=MAX_TOKENS, draft="model", draft_tokens=3, lookup=False, seed=0)
    with open_session(SessionSpec(gemma_path, draft_model=smollm_path, target_load=load, draft_load=load)) as session:
        _drafted_side_by_side(session, gemma_model, PROMPTS[:2], request)


@pytest.mark.slow
def test_letting_go_of_a_threads_openmp_team_changes_no_logits(gemma_model):
    """release_threads (called once a command's loading thread is done decoding: its OpenMP team
    would throttle the decoding thread's) frees the calling thread's team; the next decode, on
    this thread or another, makes one again and computes the same rows bit for bit."""
    from specli.llama.backend import release_threads

    tokens = gemma_model.tokenize(PROMPTS[0])

    def rows() -> np.ndarray:
        gemma_model.rewind(0)
        return np.array(gemma_model.decode(tokens, all_logits=True))

    before = rows()
    release_threads()
    assert np.array_equal(rows(), before)
    elsewhere: list[np.ndarray] = []
    assert in_threads(lambda: elsewhere.append(rows())) == []
    release_threads()
    assert np.array_equal(elsewhere[0], before)


def test_a_step_of_several_sequences_pads_to_the_size_its_curve_prices_lower():
    model = Recorder()
    slots = open_slots(model)
    # As Gemma 3 270M's on a CPU: 3 rows with logits cost more than 4, 2 less than 4.
    slots[0].steps.curve = VerifyCurve({1: 1.0, 2: 2.1, 3: 3.6, 4: 2.7, 5: 3.9, 8: 3.1, 9: 4.4})
    started = threading.Barrier(3)
    got: dict[int, list[int]] = {}

    def generation(slot: Slot) -> None:
        with slot.running():
            started.wait()
            slot.decode([1, 2, 3])  # a prompt: rows without logits, never padded
            got[slot.sequence] = [len(slot.decode([5], all_logits=True)) for _ in range(2)]

    assert in_threads(*(lambda slot=slot: generation(slot) for slot in slots)) == []
    assert got == {0: [1, 1], 1: [1, 1], 2: [1, 1]}  # each slot its own row, not the padding's
    # The prompt step as it came; each one-row step with a row more, in the last sequence, after its own.
    assert model.decodes == [[(0, 0, 3), (1, 0, 3), (2, 0, 3)]] + [[(0, p, 1), (1, p, 1), (2, p, 2)] for p in (3, 4)]
    assert [(2, 4), (2, 5)] == [f for f in model.forgotten if f[0] == 2]  # and its cell forgotten at once
    assert [slot.n_past for slot in slots] == [5, 5, 5] and slots[0].steps.padded_rows == 2
    slots[0].steps.close()

    model = Recorder()  # beside NextN layers or on a recurrent target (nothing lent): never padded
    slots = open_slots(model)
    slots[0].steps.curve, slots[0].steps.lend = VerifyCurve({1: 1.0, 2: 2.1, 3: 3.6, 4: 2.7, 5: 3.9, 8: 3.1, 9: 4.4}), False
    assert in_threads(*(lambda slot=slot: generation(slot) for slot in slots)) == []
    assert slots[0].steps.padded_rows == 0 and all(len(parts) == 3 and sum(rows for *_, rows in parts) == 3
                                                   for parts in model.decodes[1:])
    slots[0].steps.close()

    alone = open_slots(Recorder())  # one sequence alone (as --parallel 1 writes): never padded
    alone[0].steps.curve = VerifyCurve({1: 1.0, 2: 2.1, 3: 3.6, 4: 2.7, 5: 3.9, 8: 3.1, 9: 4.4})
    with alone[0].running():
        alone[0].decode([1, 2, 3], all_logits=True)
    assert alone[0].steps.model.decodes == [[(0, 0, 3)]] and alone[0].steps.padded_rows == 0
    alone[0].steps.close()
