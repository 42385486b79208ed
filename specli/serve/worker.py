"""The server's generations: as many at once as the session has slots (--parallel N; one
without), each in a thread of its own, the others waiting in a FIFO queue of bounded length.

A request becomes a Job (its prompt's tokens and its GenerationRequest); `Worker.start`
waits for its turn and starts it on the engine `Session.engine_for` builds for it; the
engine's events reach the request as they come (`Relay`), and the turn passes on when the
generation has ended, whatever ended it. With slots, a generation runs in the free slot
whose cache holds the longest prefix of its prompt, and every running generation's rows go
into one target decode a step (decode/slots.py). The session keeps what each KV cache
holds, so a request decodes only what its prompt adds to the longest prefix it shares with
an earlier one (an agent that resends its conversation prefills only the new turn), and
where another slot, running or not, holds more of it, the slot takes those cells
(`Slot.borrow`: requests with one system prompt prefill it once); an exact request decodes
its whole prompt, and among others runs alone (its text is `specli run --exact`'s).
Drafting is priced with the costs stored when the server started: it never changes midway.

Fair under pressure: a request refused because the queue is full (Busy, 503 with
Retry-After) joins a line (`Line`), by its body's hash. A place that frees up is held for the
first in that line; the others, and requests the line has not seen, are refused until it
comes back (or stops coming back, for LINE_HOLD seconds). So a client that retries the same
request keeps its place, and its turn comes after those refused before it, whoever else retries.
"""

from __future__ import annotations

import asyncio
import ctypes
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Awaitable, Callable

from specli.decode.events import Stats, StepRecord, Token
from specli.decode.media import PromptMedia
from specli.decode.ngram import TokenIndex
from specli.decode.request import GenerationRequest
from specli.decode.slots import slot_for
from specli.llama.backend import release_threads
from specli.serve.totals import Totals
from specli.session import Session
from specli.stream import Outcome, stream

# The suffix memory: the outputs of recent requests, searched by n-gram lookup. Bounded: past
# MEMORY_TOKENS, it keeps the latest outputs that fit in half of it.
MEMORY_TOKENS = 1 << 16
WAIT_POLL = 0.2  # seconds between asking whether a waiting request's client has left
# A refused request keeps its place in the line while its client retries within this many
# seconds (Retry-After says 1); the line holds at most LINE_SIZE requests (more are refused
# without a place, as before the line).
LINE_HOLD = 10.0
LINE_SIZE = 1024


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc
    except (AttributeError, OSError):
        return None


_TRIM = _malloc_trim()


def give_back_freed_memory() -> None:
    """Hand the pages the generations freed back to the system. glibc keeps freed blocks in
    its arenas, one per thread that allocated, and after a large block is freed it serves
    blocks that size from them too (its mmap threshold rises): the logits rows a step copies
    (a MiB each at a 262k vocabulary) stay the server's otherwise. Called when no generation
    runs; where the C library has no malloc_trim, nothing to do."""
    if _TRIM is not None:
        _TRIM(0)


class Busy(Exception):
    """The queue is full: the request is answered 503 with Retry-After."""

    def __init__(self, waiting: int) -> None:
        super().__init__(waiting)
        self.waiting = waiting  # the requests already waiting


class Closing(Exception):
    """The server is shutting down: no new generation starts."""


class Gone(Exception):
    """The client left while its request waited for its turn."""


@dataclass(frozen=True)
class Job:
    """One request's generation: its prompt's tokens and the request."""

    tokens: list[int]
    request: GenerationRequest
    media: PromptMedia | None = None  # its prompt's images (their positions hold placeholders in `tokens`)


class Relay:
    """A stream.Sink that hands events to the event loop: `on_event` runs there, for each Token
    and StepRecord, in order, and with None once the generation has ended."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_event: Callable[[object], None] | None) -> None:
        self._loop, self._on_event = loop, on_event

    def _send(self, event: object) -> None:
        if self._on_event is not None:
            self._loop.call_soon_threadsafe(self._on_event, event)

    def start(self) -> None:
        pass

    def token(self, event: Token) -> None:
        self._send(event)

    def step(self, record: StepRecord) -> None:
        self._send(record)

    def finish(self, stats: Stats) -> None:
        self._send(None)


class MemoryIndex:
    """The suffix memory: recent outputs in one TokenIndex, rebuilt from the latest when full."""

    def __init__(self, capacity: int = MEMORY_TOKENS) -> None:
        self.capacity = capacity
        self._outputs: list[list[int]] = []
        self.index = TokenIndex()

    def add(self, output: list[int]) -> None:
        """Remember an output (one writer at a time). Engines on other threads may be reading
        the index meanwhile: it grows at its end (the positions it hands out always have their
        tokens), and when full a new one replaces it, theirs left as it was."""
        if not output:
            return
        self._outputs.append(list(output))
        if len(self.index.tokens) + len(output) + 1 <= self.capacity:
            self.index.append(output)
            return
        kept, size = [], 0
        for text in reversed(self._outputs):
            room = self.capacity // 2 - size - 1
            if room <= 0:
                break
            kept.append(text[-room:])  # the latest output alone may be longer than the half: its end
            size += min(len(text), room) + 1
        self._outputs = kept[::-1]
        index = TokenIndex()
        for text in self._outputs:
            index.append(text)
        self.index = index


class Line:
    """Requests refused for a full queue, by key, in the order first refused, each with when
    its client last asked. A key not heard of for `hold` seconds leaves the line."""

    def __init__(self, hold: float = LINE_HOLD, size: int = LINE_SIZE, clock: Callable[[], float] = time.monotonic):
        self.hold, self.size, self._clock = hold, size, clock
        self._asked: OrderedDict[str, float] = OrderedDict()

    def ahead(self, key: str) -> int:
        """How many in the line come before `key` (all of them, for a key not in it)."""
        now = self._clock()
        for late in [k for k, asked in self._asked.items() if asked < now - self.hold]:
            del self._asked[late]
        return list(self._asked).index(key) if key in self._asked else len(self._asked)

    def refuse(self, key: str) -> None:
        """`key` was refused: it keeps its place (or takes the last one), as of now."""
        if key in self._asked or len(self._asked) < self.size:
            self._asked[key] = self._clock()

    def admit(self, key: str) -> None:
        self._asked.pop(key, None)

    def __len__(self) -> int:
        return len(self._asked)


class Worker:
    def __init__(self, session: Session, *, queue: int, memory: bool, measure: bool = True) -> None:
        self.session = session
        self.queue = queue
        self.memory = MemoryIndex() if memory else None
        self.closing = threading.Event()  # set on SIGINT/SIGTERM: the generation in flight stops
        # -k auto prices every request with the costs read now, before any request (a request
        # may draft on a server started with --draft none, and a calibration between requests
        # would leave the target's cache empty: see module doc). `measure`: where none are
        # stored, measured now (a server whose own drafting is -k auto); else the prior's.
        session.pricing.costs(measure=measure, keep=True)
        for kind in session.pricing.drafters:  # and each loaded drafter's, which a request may draft with
            session.pricing.costs(measure=measure, keep=True, kind=kind)
        release_threads()  # this thread decodes no more: the generations do, on their own threads
        self.parallel = max(1, len(session.slots))  # generations at once
        self._thread = ThreadPoolExecutor(max_workers=self.parallel, thread_name_prefix="specli-generate")
        self._turn: asyncio.Semaphore | None = None  # made in the event loop, on first use
        self._admitted = 0  # requests generating or waiting for the turn
        self.line = Line()  # requests refused for a full queue, whose clients may retry
        self._free = list(session.slots)  # the slots no generation runs in
        self._slots = threading.Lock()  # over _free and the memory
        self.totals = Totals()  # what the generations did, all told (/metrics)

    @property
    def generating(self) -> int:
        return min(self._admitted, self.parallel)

    @property
    def waiting(self) -> int:
        return max(0, self._admitted - self.parallel)

    def busy_slots(self) -> set[int]:
        """The slots a generation runs in (one slot, 0, without --parallel)."""
        if not self.session.slots:
            return {0} if self.generating else set()
        with self._slots:
            return {slot.sequence for slot in self.session.slots if slot not in self._free}

    async def start(self, job: Job, on_event: Callable[[object], None] | None,
                    gone: Callable[[], Awaitable[bool]] | None = None,
                    key: str = "") -> tuple[asyncio.Future, threading.Event]:
        """Wait for the turn (Busy when the queue is full, or its free places are held for
        requests refused before: `key` names this one in that line), then start the job in
        the worker thread. Returns the future of its Outcome and the event that cancels it;
        the turn passes on when the generation ends. `gone`: whether the client has left,
        asked while the job waits (Gone: it gives up its place)."""
        if self.closing.is_set():
            raise Closing
        if self._turn is None:
            self._turn = asyncio.Semaphore(self.parallel)  # FIFO: waiters are woken in the order they came
        free = self.queue + self.parallel - self._admitted  # `parallel` generating and `queue` waiting
        if free <= self.line.ahead(key):
            self.line.refuse(key)
            raise Busy(self.queue)
        self.line.admit(key)
        self._admitted += 1
        admitted = time.perf_counter()
        future = None
        try:
            await self._wait_for_turn(gone)
            if self.closing.is_set():
                self._turn.release()
                raise Closing
            loop = asyncio.get_running_loop()
            cancel = threading.Event()
            try:
                future = loop.run_in_executor(self._thread, self._generate, job, Relay(loop, on_event), cancel,
                                              admitted)
            except BaseException:
                self._turn.release()
                raise
        finally:
            if future is None:  # it left, or never started: its place is free
                self._admitted -= 1
        turn = self._turn

        def ended(_: object) -> None:
            self._admitted -= 1
            turn.release()

        future.add_done_callback(ended)
        return future, cancel

    async def _wait_for_turn(self, gone: Callable[[], Awaitable[bool]] | None) -> None:
        """Acquire the turn; every WAIT_POLL seconds, ask whether the client has left."""
        assert self._turn is not None
        lock = self._turn
        turn = asyncio.ensure_future(lock.acquire())
        try:
            while True:
                done, _ = await asyncio.wait({turn}, timeout=WAIT_POLL)
                if done:
                    return
                if gone is not None and await gone():
                    raise Gone
        except BaseException:  # it left, or this handler was cancelled (shutdown), or gone() failed
            # The acquire must not outlive it: cancelled, or, where it got the turn all the
            # same (as it was cancelled), given the turn back at once.
            def give_back(task: asyncio.Future) -> None:
                if not task.cancelled() and task.exception() is None:
                    lock.release()

            turn.cancel()
            turn.add_done_callback(give_back)
            raise

    def _generate(self, job: Job, sink: Relay, cancel: threading.Event, admitted: float = 0.0) -> Outcome:
        """In a worker thread: the request's engine, then stream. An exact request decodes
        its whole prompt, as `specli run --exact` does (a prompt split at a kept prefix rounds
        otherwise). `admitted`: when its request was let in (perf_counter), for its wait."""
        started = time.perf_counter()
        memory = self.memory.index if self.memory is not None else None
        cancelled = lambda: cancel.is_set() or self.closing.is_set()  # noqa: E731
        if not self.session.slots:
            if job.request.exact:
                self.session.clear_cache()
            engine = self.session.engine_for(job.request, memory=memory, images=job.media is not None)
            outcome = stream(engine, job.tokens, sink, cancelled=cancelled, media=job.media)
            self.session.pricing.review(outcome.stats)  # stale costs: measured again when the server next starts
            idle = True
        else:  # (a shared step's time is the batch's: no review of the costs)
            with self._slots:
                slot = slot_for(job.tokens, self._free)
                self._free.remove(slot)
            try:
                if not job.request.exact and job.media is None:  # (those start from an empty cache)
                    slot.borrow(job.tokens)
                engine = self.session.engine_for(job.request, memory=memory, slot=slot, images=job.media is not None)
                # (an image is decoded by mtmd, outside the shared step: its request runs alone)
                with slot.running(exclusive=job.request.exact or job.media is not None):
                    outcome = stream(engine, job.tokens, sink, cancelled=cancelled, media=job.media)
            finally:
                if job.media is not None:  # (this thread decoded the images: the shared steps decode the rest)
                    release_threads()
                with self._slots:
                    self._free.append(slot)
                    idle = len(self._free) == len(self.session.slots)
        if self.memory is not None and outcome.stats.finish_reason != "cancelled":
            with self._slots:
                self.memory.add(outcome.tokens)
        outcome.waited = max(0.0, started - admitted) if admitted else 0.0
        self.totals.add(outcome.stats)
        if idle:
            give_back_freed_memory()
        return outcome

    def close(self) -> None:
        self.closing.set()
        self._thread.shutdown(wait=True)
