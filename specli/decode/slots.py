"""Several generations on one target, each in its own sequence, one target decode a step for
all of them (`specli serve --parallel N`, `specli run --batch`).

A `Slot` is one sequence of the target as an engine sees it (engine.TargetModel): its own
positions, its own rewinds. Its decode does not call llama.cpp itself: it hands its rows to
`SharedSteps` and waits; once every running slot has handed in its rows, one
`decode_sequences` decodes them all and each slot gets its own logits rows back. So engines on
their own threads run their steps in lock step, and each step of the batch is one decode:
every request's [last] + draft rows side by side.

Invariants:
- only running slots are waited for (`Slot.running()` around a generation);
- the rows a slot gets stay valid until it hands in its next ones: no decode starts before
  every running slot has handed in, and a slot that stops running hands in nothing;
- everything that touches the context (the decodes, a slot's rewind) runs under one lock, and
  every decode on one thread of its own, whichever slot's thread handed in last (the context
  is driven from one thread, as llama-server drives its own);
- a prompt goes in chunks of PREFILL_CHUNK rows, a chunk a step, while other slots run (a
  slot alone decodes it whole, as a one-sequence run does), so nobody stalls behind it;
- an `exclusive` slot (an exact request) runs alone: it waits for the running slots to end,
  holds new ones back, and finds the cache empty (every sequence forgotten, its own too), so
  its decodes are those of a fresh one-sequence run (the same cells, the same batches:
  --exact's measured sizes hold);
- a failed decode fails every slot that was in it, and nobody else;
- a target step of several sequences whose rows all want logits may carry up to PAD_MOST rows
  more, the last part's last token again, where the session's measured curve prices that step
  lower (`SharedSteps._padding`): their logits are never read and their cells are forgotten
  before any slot gets its rows;
- a step's rows are in the order of their sequences, however the threads came in: the same
  slots with the same rows decode the same batch;
- a draft model (`SharedSteps.draft`, loaded with as many sequences), or the target's NextN
  layer (`submit(drafter=...)`: decode/mtp.py's NextnSlot), drafts the same way:
  each slot's `DraftSlot` hands in its rows, and once every running slot has handed in rows
  for one model or the other, the draft model's rows go first, in one decode of their own
  (one draft decode per draft position across the sequences, as llama-server drafts), while
  the slots already done drafting wait for the target's step;
- what a slot's draft-length policy reads of the others (`Slot.others`: their rows and the
  tokens they expected from them) is the last step's, fixed when it was decoded, so it reads
  the same whatever the threads' timing;
- a served prompt starts from the longest prefix of it that any sequence's cache holds,
  running or not (`Slot.borrow`; where another is decoding a prompt that opens alike, once
  that is in): the cells are shared, not decoded again, so requests that begin alike (a
  system prompt, the same conversation) prefill it once (`run --batch` keeps to each slot's
  own cache: what another holds when a job starts hangs on the threads' timing).
  What SharedSteps knows each sequence holds (`_held`) is a prefix of its cells' tokens,
  changed only under the lock, with the decodes and rewinds that change the cells. Not on a
  recurrent or hybrid target (a state is one, at its end), nor beside the target's NextN
  layers (they read the target's hidden rows of each position); on a sliding window, only
  from a sequence that never reached the window's length (past it, cells at the start may
  have been written over).
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Protocol, Sequence

import numpy as np

from specli.decode.costs import VerifyCurve
from specli.decode.engine import TargetCache
from specli.decode.text import common_prefix_length

PREFILL_CHUNK = 128  # a prompt's rows a step, while other slots run
# A step of several sequences pads with up to PAD_MOST rows where its curve prices the larger
# step at least PAD_GAIN below its own (SharedSteps._padding).
PAD_MOST = 3
PAD_GAIN = 0.05
COMING_GRACE = 0.5  # seconds a generation may take from its borrow to its first step before nobody waits for it


class SequenceModel(Protocol):
    """What the slots need of the target (backend.Model with settings.sequences > 1)."""

    sequences: int
    n_ctx: int  # each sequence's
    n_swa: int  # a sliding window's length (0: none)
    batch_size: int
    # A recurrent or hybrid model's snapshots a sequence: how far a rewind takes a sequence's
    # state back after a decode (None: an attention cache, any rewind).
    max_rewind: int | None
    checkpoint_tail: int  # (a recurrent model's) a prompt's checkpoint this many tokens before its end

    def decode_sequences(self, parts: Sequence[tuple[int, int, list[int], Sequence[bool]]]) -> list[np.ndarray]: ...
    def forget(self, sequence: int, n_keep: int) -> None: ...
    def share(self, source: int, sequence: int, n: int) -> None: ...
    def checkpoint(self, sequence: int, at: int, count: int) -> None: ...
    def restore_checkpoint(self, sequence: int, n_keep: int) -> int: ...


@dataclass
class Part:
    """One sequence's rows in a shared decode."""

    first: int  # the position of its first row
    tokens: list[int]
    outputs: list[bool]
    hidden: np.ndarray | None = None  # the target's state beside each token (NextN layers' entries)


class SharedSteps:
    """The step every running slot's rows go into. `steps`, `rows`: decodes run and rows
    decoded so far (the batch's mean rows a step: rows / steps)."""

    def __init__(self, model: SequenceModel, draft: SequenceModel | None = None) -> None:
        self.model = model
        self.draft = draft  # a draft model with as many sequences (DraftSlot decodes on it)
        self._lock = threading.Condition()
        self._running: set[int] = set()
        self._pending: dict[int, Part] = {}  # the target's rows for the next step, by sequence
        self._drafting: dict[int, tuple[SequenceModel, Part]] = {}  # a drafter's (the draft model, NextN layers)
        self._results: dict[int, np.ndarray | BaseException] = {}
        # A decode for the decoding thread (which model, its parts), and whether one is in hand.
        self._ready: tuple[SequenceModel, dict[int, Part]] | None = None
        self._busy = False
        self._thread: threading.Thread | None = None
        self._closed = False
        self._exclusive: int | None = None  # the slot running alone
        self._expected: dict[int, float] = {}  # by sequence: the tokens its next step's rows should bring
        self._last: dict[int, tuple[int, float]] = {}  # by sequence: its rows and expected tokens, last step
        self._waiting_alone = 0  # exclusive slots waiting for the others to end
        # By sequence: the target's tokens its cache holds from position 0 (a prefix of them),
        # and the most positions it has held since it was last emptied.
        self._held: dict[int, list[int]] = {}
        self._peak: dict[int, int] = {}
        self._coming: dict[int, tuple[list[int], float]] = {}  # by sequence: the prompt it decodes, since when
        self.lend = model.max_rewind is None  # whether a prompt may start from another sequence's cells
        self.slots: list[Slot] = []
        self.steps = 0
        self.rows = 0
        self.draft_steps = 0  # the draft model's decodes, and their rows
        self.draft_rows = 0
        # What a target step of b rows, each with logits, costs where it was measured (the
        # session's stored or first-run curve; None: never padded), and the rows padded so far.
        self.curve: VerifyCurve | None = None
        self.padded_rows = 0

    @property
    def running(self) -> int:
        with self._lock:
            return len(self._running)

    def start(self, sequence: int, exclusive: bool = False) -> None:
        """A generation starts in `sequence`; exclusive: once no other runs, and alone, the
        other sequences forgotten."""
        with self._lock:
            if exclusive:
                self._waiting_alone += 1
                while self._running or self._exclusive is not None:
                    self._lock.wait()
                self._waiting_alone -= 1
                self._exclusive = sequence
                for slot in self.slots:  # its own too: its prompt decoded whole, as a fresh run's
                    slot.rewind(0)
            else:
                while self._exclusive is not None or self._waiting_alone:
                    self._lock.wait()
            self._running.add(sequence)

    def stop(self, sequence: int) -> None:
        with self._lock:
            self._running.discard(sequence)
            self._pending.pop(sequence, None)
            self._coming.pop(sequence, None)
            if self._exclusive == sequence:
                self._exclusive = None
            self._run_if_ready()
            self._lock.notify_all()  # a slot waiting to start, alone or beside

    def submit(self, sequence: int, part: Part, *, draft: bool = False, drafter: SequenceModel | None = None) -> Any:
        """Hand in a slot's rows (for the draft model: `draft`; for another drafter of as many
        sequences, the target's NextN layers: `drafter`); return what its decode gives them
        (logits rows) once they are decoded."""
        drafter = self.draft if draft else drafter
        with self._lock:
            if drafter is None:
                self._pending[sequence] = part
            else:
                self._drafting[sequence] = (drafter, part)
            self._run_if_ready()
            while sequence not in self._results:
                self._lock.wait()
            result = self._results.pop(sequence)
        if isinstance(result, BaseException):
            raise result
        return result

    def forget(self, sequence: int, n_keep: int, *, draft: bool = False, drafter: SequenceModel | None = None) -> None:
        with self._lock:
            model = self.draft if draft else drafter or self.model
            assert model is not None
            model.forget(sequence, n_keep)
            if model is self.model:
                self._forgotten(sequence, n_keep)

    def _forgotten(self, sequence: int, n_keep: int) -> None:
        del self._held.setdefault(sequence, [])[n_keep:]
        if n_keep == 0:
            self._peak[sequence] = 0

    def took(self, sequence: int, first: int) -> None:
        """Another binding decoded positions from `first` on into `sequence` (an image's)."""
        with self._lock:
            del self._held.setdefault(sequence, [])[first:]  # (what follows is not lent)

    def share(self, sequence: int, prompt: Sequence[int], own: int) -> int:
        """Where another sequence's cache holds more of `prompt` than the `own` positions
        `sequence` keeps of it, `sequence` holds that prefix now, its own cells forgotten (a
        sequence no generation runs in): the positions of `prompt` it holds. Where another is
        decoding a prompt that begins as this one does (it started a moment before), first
        wait for that prompt's decode: the opening is decoded once. From here on, `prompt` is
        what `sequence` is coming to hold, for the requests that start after it."""
        with self._lock:
            if not self.lend:
                return own
            self._coming.pop(sequence, None)
            while True:
                best, source = own, None
                for other, held in self._held.items():
                    n = common_prefix_length(held, prompt)
                    if n > best and other != sequence and self._lends(other, n):
                        best, source = n, other
                if not self._awaited(sequence, prompt, best):
                    break
                self._lock.wait(COMING_GRACE)
            self._coming[sequence] = (list(prompt), time.monotonic())
            if source is None:
                return own
            self.model.forget(sequence, 0)
            self.model.share(source, sequence, best)
            self._held[sequence], self._peak[sequence] = list(prompt[:best]), best
            return best

    def _lends(self, sequence: int, n: int) -> bool:
        """Whether `sequence`'s first cells are all there, once it has held n positions (past a
        sliding window's length, llama.cpp may have written over them)."""
        return not self.model.n_swa or max(self._peak.get(sequence, 0), n) < self.model.n_swa

    def _awaited(self, sequence: int, prompt: Sequence[int], best: int) -> bool:
        """Whether another sequence is coming to hold more of `prompt` than `best` (the lock
        held): it runs, or it started less than COMING_GRACE seconds ago (a generation that
        never starts, or stops, is waited for no longer)."""
        now = time.monotonic()
        for other, (coming, since) in self._coming.items():
            n = common_prefix_length(coming, prompt)
            if n > best and other != sequence and self._lends(other, len(coming)) \
                    and len(self._held.get(other, ())) < len(coming) \
                    and (other in self._running or now - since < COMING_GRACE):
                return True
        return False

    def checkpoint(self, sequence: int, at: int, count: int) -> None:
        """Keep a recurrent target's state of `sequence` (at position `at`) on the host, between decodes."""
        with self._lock:
            self.model.checkpoint(sequence, at, count)

    def restore(self, sequence: int, n_keep: int) -> int:
        """`sequence` of a recurrent target back at its latest checkpoint at or before n_keep,
        else emptied: where it stands now."""
        with self._lock:
            at = self.model.restore_checkpoint(sequence, n_keep)
            if at == 0:
                self.model.forget(sequence, 0)
            self._forgotten(sequence, at)
            return at

    def expect(self, sequence: int, tokens: float) -> None:
        with self._lock:
            self._expected[sequence] = tokens

    def others(self, sequence: int) -> tuple[int, float]:
        """The other slots' rows in the last step, and the tokens they expected from them (a
        slot whose policy says nothing: one a step)."""
        with self._lock:
            last = [value for other, value in self._last.items() if other != sequence]
        return sum(rows for rows, _ in last), sum(tokens for _, tokens in last)

    def close(self) -> None:
        """Stop the decoding thread (the slots' generations have ended)."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join()

    def _run_if_ready(self) -> None:
        """Hand a decode to the decoding thread once every running slot has handed in rows
        (the lock held): the draft model's where any slot has handed in draft rows, else the
        target's step."""
        if self._ready is not None or self._busy:
            return
        waiting = self._pending.keys() | self._drafting.keys()
        if not waiting or not self._running <= waiting:
            return
        if self._drafting:  # one drafter's rows (where two draft, the other's next time)
            drafter = next(iter(self._drafting.values()))[0]
            parts = {sequence: part for sequence, (model, part) in self._drafting.items() if model is drafter}
            self._drafting = {sequence: entry for sequence, entry in self._drafting.items() if sequence not in parts}
            self._ready = (drafter, parts)
        else:
            self._ready, self._pending = (self.model, self._pending), {}
            self._last = {sequence: (_recurring_rows(part), self._expected.pop(sequence, 1.0 if part.outputs[-1] else 0.0))
                          for sequence, part in self._ready[1].items()}
        if self._thread is None:
            self._thread = threading.Thread(target=self._decoding, name="specli-steps", daemon=True)
            self._thread.start()
        self._lock.notify_all()

    def _decoding(self) -> None:
        with self._lock:
            while True:
                while self._ready is None and not self._closed:
                    self._lock.wait()
                if self._ready is None:
                    return
                (model, parts), self._ready = self._ready, None
                self._busy = True
                try:
                    self._results.update(self._decode(model, parts))
                except BaseException as error:  # every slot in the step hears of it
                    for sequence in parts:
                        self._results[sequence] = error
                self._busy = False
                self._run_if_ready()  # (rows handed in meanwhile by a slot that is not running)
                self._lock.notify_all()

    def _decode(self, model: SequenceModel, parts: dict[int, Part]) -> dict[int, np.ndarray]:
        """One model's rows in as few decodes as its batch size allows (the earlier ones' rows
        copied: the next decode reuses the buffer; the last one's handed back as views)."""
        results: dict[int, np.ndarray] = {}
        groups: list[list[tuple[int, Part]]] = [[]]
        for sequence, part in sorted(parts.items()):  # by sequence, whoever handed in first
            if groups[-1] and sum(len(p.tokens) for _, p in groups[-1]) + len(part.tokens) > model.batch_size:
                groups.append([])
            groups[-1].append((sequence, part))
        pad = self._padding(groups[0]) if model is self.model and len(groups) == 1 else 0
        for index, group in enumerate(groups):
            decoding = [(sequence, part.first, part.tokens, part.outputs) + (() if part.hidden is None else (part.hidden,))
                        for sequence, part in group]
            if pad:  # rows that repeat the last part's last token, after its own, their logits never read
                sequence, first, tokens, outputs = decoding[-1]
                decoding[-1] = (sequence, first, tokens + tokens[-1:] * pad, list(outputs) + [True] * pad)
            rows = model.decode_sequences(decoding)
            if pad:
                sequence, first, tokens, _ = decoding[-1]
                model.forget(sequence, first + len(tokens) - pad)
                rows[-1] = rows[-1][:-pad]
                self.padded_rows += pad
            decoded = sum(len(part.tokens) for _, part in group)
            if model is self.model:
                self.steps += 1
                self.rows += decoded
                for sequence, part in group:
                    held = self._held.setdefault(sequence, [])
                    if len(held) >= part.first:  # (else a gap: what follows is not lent)
                        held[part.first :] = part.tokens
                    self._peak[sequence] = max(self._peak.get(sequence, 0), part.first + len(part.tokens))
            else:
                self.draft_steps += 1
                self.draft_rows += decoded
            last = index == len(groups) - 1
            for (sequence, _), out in zip(group, rows):  # (the NextN layers' come as copies)
                results[sequence] = out if last or not isinstance(out, np.ndarray) else np.array(out)
        return results

    def _padding(self, group: list[tuple[int, Part]]) -> int:
        """The rows to add to a target step of several sequences where the measured curve prices
        a step of more rows lower: on a CPU, llama.cpp's kernels take logits rows in fours, and
        Gemma 3 270M's step of 3 rows costs 1.3x one of 4 (docs/design.md). None where the
        curve was not measured, the step is one sequence's or an exact request's (its batches
        are --exact's measured ones), holds rows that want no logits (a prompt's chunk: the
        curve times rows that all want them), the target is recurrent or hybrid (its state
        would take the rows in) or beside NextN layers, or the last sequence has no room."""
        curve = self.curve
        if curve is None or len(group) < 2 or self._exclusive is not None or not self.lend:
            return 0  # (`lend` is off where anything but the cells reads a position: a state, NextN layers)
        if any(not all(part.outputs) for _, part in group):
            return 0
        rows = sum(len(part.tokens) for _, part in group)
        last = group[-1][1]
        room = min(PAD_MOST, self.model.batch_size - rows, self.model.n_ctx - last.first - len(last.tokens))
        costs = {extra: curve.cost(rows + extra) for extra in range(room + 1)}
        best = min(costs, key=costs.__getitem__)
        return best if costs[best] <= (1.0 - PAD_GAIN) * costs[0] else 0


def _recurring_rows(part: Part) -> int:
    """The rows a slot's part stands for in the others' next steps: a verify batch's (rows
    read past the last: a draft) as they are; a prompt's chunk (or a plain step) one, the row
    its generation decodes a step once the prompt is in. A chunk of 128 rows taken as the
    others' recurring cost made a drafted row look nearly free beside it (a draft model that
    agreed with the target drafted 48 tokens a step)."""
    return len(part.tokens) if sum(map(bool, part.outputs)) > 1 else 1


class Slot:
    """One sequence of the target, as an engine sees it: decode, rewind, its positions, and
    what its cache holds across generations (`cache`); the target's vocabulary is read through it."""

    drafts = False  # its rows go to the target (DraftSlot: to the draft model)

    def __init__(self, steps: SharedSteps, sequence: int) -> None:
        self.steps = steps
        self.sequence = sequence
        self.n_ctx = self.model.n_ctx
        self.n_past = 0
        self.exclusive = False
        self.cache = TargetCache()
        # A recurrent or hybrid target's: how far a rewind takes the state back now (a snapshot
        # within the last part decoded), and the prompt checkpoints kept (keep_checkpoints).
        self._reach = 0
        self.checkpoints = 0

    @property
    def model(self) -> SequenceModel:
        return self.steps.model

    def __getattr__(self, name: str) -> Any:  # the model's tokens, pieces, end-of-generation test
        return getattr(self.model, name)

    @contextmanager
    def running(self, exclusive: bool = False) -> Iterator[Slot]:
        """While a generation runs here: the step waits for this slot's rows. `exclusive`:
        it runs alone (an exact request), as SharedSteps.start says."""
        self.begin(exclusive)
        try:
            yield self
        finally:
            self.end()

    def begin(self, exclusive: bool = False) -> None:
        """From now on every step waits for this slot's rows (running() holds it for one generation)."""
        self.steps.start(self.sequence, exclusive)
        self.exclusive = exclusive

    def end(self) -> None:
        self.exclusive = False
        self.steps.stop(self.sequence)

    def took(self, first: int, positions: int) -> None:
        """Count positions another binding decoded into this sequence (an image's, while this
        slot runs alone: specli.llama.vision)."""
        if first != self.n_past or not self.exclusive:
            raise ValueError(f"sequence {self.sequence}: positions decoded at {first} beside others or not at "
                             f"n_past ({self.n_past})")
        self.steps.took(self.sequence, first)
        self.n_past += positions
        self._reach = 0

    def keep_checkpoints(self, count: int) -> None:
        """As Model.keep_checkpoints, for this sequence of a recurrent or hybrid target: each
        prompt's state is kept CHECKPOINT_TAIL tokens before its end, the last `count` of them,
        so that a later prompt sharing the conversation decodes on from one (0: prompts decode
        whole)."""
        self.checkpoints = count if self.model.max_rewind is not None else 0

    def decode(self, tokens: list[int], *, all_logits: bool = False,
               outputs: Sequence[bool] | None = None) -> np.ndarray:
        """As the one-sequence Model.decode: rows for every token (all_logits), the flagged
        ones and the last (outputs), or the last only."""
        if not tokens:
            raise ValueError("decode needs at least one token")
        if self.n_past + len(tokens) > self.n_ctx:
            raise ValueError(f"sequence {self.sequence}: {len(tokens)} rows past its {self.n_ctx} positions")
        if (all_logits or outputs is not None) and len(tokens) > self.model.batch_size:
            raise ValueError("a decode with rows besides the last is limited to one batch")
        flags = [True] * len(tokens) if all_logits else \
            [bool(flag) for flag in outputs[: len(tokens)]] if outputs is not None else [False] * len(tokens)
        flags[-1] = True
        tail = self.model.checkpoint_tail if self.checkpoints else 0
        if tail and not (all_logits or outputs is not None) and len(tokens) > tail:
            # a prompt: decoded up to `tail` tokens before its end, its state kept, then the rest
            kept, self.checkpoints = self.checkpoints, 0
            try:
                self.decode(tokens[:-tail])
            finally:
                self.checkpoints = kept
            self.steps.checkpoint(self.sequence, self.n_past, self.checkpoints)
            return self.decode(tokens[-tail:])
        chunk = self._chunk(len(tokens), all_logits or outputs is not None)
        start = 0
        while True:
            end = min(len(tokens), start + chunk)
            rows = self.steps.submit(self.sequence, Part(self.n_past, tokens[start:end], flags[start:end]),
                                     draft=self.drafts)
            self.n_past += end - start
            # a recurrent target's snapshots follow each of the part's tokens but its last
            self._reach = min(self.model.max_rewind or 0, end - start - 1)
            if end == len(tokens):
                return rows
            start = end

    def borrow(self, prompt: Sequence[int]) -> None:
        """Before a generation here (not running yet): where another sequence's cache,
        running or not, holds a longer prefix of `prompt` than this one's, take its cells
        (SharedSteps.share); the engine decodes the rest of the prompt."""
        own = min(self.n_past, common_prefix_length(self.cache.tokens, prompt))
        held = self.steps.share(self.sequence, prompt, own)
        if held > own:
            self.n_past, self._reach = held, 0
            self.cache.tokens, self.cache.prompt, self.cache.prompt_row = list(prompt[:held]), None, None

    def others(self) -> tuple[int, float]:
        """The other requests' rows in the step, and the tokens they expect from them."""
        return self.steps.others(self.sequence)

    def expect(self, tokens: float) -> None:
        """The tokens this slot's next rows should bring (its policy's expectation)."""
        self.steps.expect(self.sequence, tokens)

    def decode_argmax(self, tokens: list[int], *, all_rows: bool = False) -> Sequence[int]:
        raise NotImplementedError("a slot verifies on the host")

    def rewind(self, n_keep: int) -> None:
        """Forget this sequence's positions from n_keep on. A recurrent or hybrid target's
        state goes back only as far as the last part's snapshots: past them, to the latest
        checkpoint at or before n_keep, else to the start, and n_past says where it stands
        (the engine decodes the rest of its prompt from there, in the shared steps)."""
        if n_keep < self.n_past:
            if 0 < n_keep and self.model.max_rewind is not None and self.n_past - n_keep > self._reach:
                n_keep = self.steps.restore(self.sequence, n_keep)
            else:
                self.steps.forget(self.sequence, n_keep, draft=self.drafts)
            self._reach = 0  # (llama.cpp takes one snapshot back, once, until the next decode)
        self.n_past = min(self.n_past, n_keep)

    def _chunk(self, n: int, rows_wanted: bool) -> int:
        """Rows a step for a decode of n: whole where the slot is alone or wants rows from
        more than the last (a verify batch); else PREFILL_CHUNK, within the batch."""
        whole = min(n, self.model.batch_size)
        if rows_wanted or self.exclusive or self.steps.running <= 1:
            return whole
        return min(whole, PREFILL_CHUNK)


class DraftSlot(Slot):
    """The same sequence of the draft model (DraftModel's model, in a slot): its decodes go
    into the draft model's shared decodes (SharedSteps.draft); the target's slot of the same
    sequence holds the generation's place in the step (Slot.running)."""

    drafts = True

    @property
    def model(self) -> SequenceModel:
        assert self.steps.draft is not None
        return self.steps.draft

    def close(self) -> None:
        pass  # the session closes the draft model itself


def draft_slots(slots: Sequence[Slot], draft: SequenceModel) -> list[DraftSlot]:
    """The draft model's sequences beside the target's slots, one each, sharing their steps
    (`draft` loaded with as many sequences)."""
    if draft.sequences < len(slots):
        raise ValueError(f"a draft model of {draft.sequences} sequences beside {len(slots)} slots")
    steps = slots[0].steps
    steps.draft = draft
    return [DraftSlot(steps, slot.sequence) for slot in slots]


def slot_for(prompt: list[int], free: Iterable[Slot]) -> Slot:
    """Of the free slots, the one whose cache holds the longest prefix of `prompt` (the first on
    a tie): an agent resending its conversation prefills only the new turn."""
    return max(free, key=lambda slot: min(slot.n_past, common_prefix_length(slot.cache.tokens, prompt)))


def open_slots(model: SequenceModel) -> list[Slot]:
    """A slot for each of the target's sequences, sharing one step."""
    steps = SharedSteps(model)
    steps.slots = [Slot(steps, sequence) for sequence in range(model.sequences)]
    return list(steps.slots)
