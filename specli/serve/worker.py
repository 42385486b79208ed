"""The server's generations: one at a time on the loaded pair, in a thread of their own,
the others waiting in a FIFO queue of bounded length.

A request becomes a Job (prompt tokens, sampling, proposer, policy); `Worker.start` waits
for its turn and starts it; the engine's events reach the request as they come (`Relay`),
and the turn passes on when the generation has ended, whatever ended it. One Engine is kept
for the whole server, so the target's KV cache keeps the longest prefix a request shares
with the one before (an agent that resends its conversation prefills only the new turn).
Drafting is priced with the costs stored when the server started: it never changes midway.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Awaitable, Callable

import numpy as np

from specli.decode.adaptive import MAX_DRAFT
from specli.decode.costs import StepCosts
from specli.decode.engine import DraftTokens, Engine, FixedDraftPolicy, GenerationOptions, Stats, StepRecord, Token
from specli.decode.proposers import (LookupThenModel, NGramProposer, NoProposer, Proposer, TokenIndex, draft_model_of,
                              model_proposer_of)
from specli.decode.sampling import SamplingSettings
from specli.session import Session, exact_batch_sizes
from specli.stream import Outcome, stream

# The suffix memory: the outputs of recent requests, searched by n-gram lookup. Bounded: past
# MEMORY_TOKENS, it keeps the latest outputs that fit in half of it.
MEMORY_TOKENS = 1 << 16
WAIT_POLL = 0.2  # seconds between asking whether a waiting request's client has left


class Busy(Exception):
    """The queue is full: the request is answered 503 with Retry-After."""


class Closing(Exception):
    """The server is shutting down: no new generation starts."""


class Gone(Exception):
    """The client left while its request waited for its turn."""


@dataclass(frozen=True)
class Job:
    """One request's generation, as the engine runs it."""

    tokens: list[int]
    options: GenerationOptions
    draft: str  # "none" | "ngram" | "model"
    draft_tokens: DraftTokens
    exact: bool
    seed: int
    prediction: list[int] | None = None  # a Predicted Output's tokens, for n-gram lookup only


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
        self.index = TokenIndex()
        for text in self._outputs:
            self.index.append(text)


class Worker:
    def __init__(self, session: Session, *, queue: int, memory: bool) -> None:
        self.session = session
        self.queue = queue
        self.memory = MemoryIndex() if memory else None
        self.closing = threading.Event()  # set on SIGINT/SIGTERM: the generation in flight stops
        self._engine = Engine(session.target, NoProposer(), FixedDraftPolicy(0), GenerationOptions(), session.seed)
        self._costs: StepCosts = self._fixed_costs()
        self._exact_batch: dict[bool, int] | None = None  # measured on the first exact request
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specli-generate")
        self._turn: asyncio.Lock | None = None  # made in the event loop, on first use
        self._admitted = 0  # requests generating or waiting for the turn

    @property
    def draft_model(self) -> Proposer | None:
        """The loaded draft model's proposer (drafting through text where its vocabulary
        differs), without lookup in front of it."""
        return model_proposer_of(self.session.proposer)

    def _fixed_costs(self) -> StepCosts:
        """The costs -k auto prices every request with, read (or, the first time, measured) once,
        before any request: a request may draft on a server started with --draft none, and a
        calibration between requests would leave the target's cache empty (see module doc)."""
        return self.session.costs()

    async def start(self, job: Job, on_event: Callable[[object], None] | None,
                    gone: Callable[[], Awaitable[bool]] | None = None) -> tuple[asyncio.Future, threading.Event]:
        """Wait for the turn (Busy when the queue is full), then start the job in the worker
        thread. Returns the future of its Outcome and the event that cancels it; the turn
        passes on when the generation ends. `gone`: whether the client has left, asked while
        the job waits (Gone: it gives up its place)."""
        if self.closing.is_set():
            raise Closing
        if self._turn is None:
            self._turn = asyncio.Lock()  # FIFO: waiters are woken in the order they came
        if self._admitted > self.queue:  # one generating and `queue` waiting
            raise Busy
        self._admitted += 1
        future = None
        try:
            await self._wait_for_turn(gone)
            if self.closing.is_set():
                self._turn.release()
                raise Closing
            loop = asyncio.get_running_loop()
            cancel = threading.Event()
            try:
                future = loop.run_in_executor(self._thread, self._generate, job, Relay(loop, on_event), cancel)
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

    def _generate(self, job: Job, sink: Relay, cancel: threading.Event) -> Outcome:
        """In the worker thread: the job's proposer and policy on the kept engine, then stream."""
        engine = self._engine
        engine.proposer = self._proposer(job)
        engine.policy = self._policy(job, engine.proposer)
        engine.options = job.options
        engine.seed = job.seed
        outcome = stream(engine, job.tokens, sink, cancelled=lambda: cancel.is_set() or self.closing.is_set())
        if self.memory is not None and outcome.stats.finish_reason != "cancelled":
            self.memory.add(outcome.tokens)
        return outcome

    def _proposer(self, job: Job) -> Proposer:
        if job.draft == "none":
            return NoProposer()
        # The prediction is where the answer is expected to go, right after the prompt: indexed
        # behind the prompt's last tokens, it drafts the answer's opening too.
        opening = job.tokens[-NGramProposer.LENGTHS[0] :]
        references = [TokenIndex(opening + job.prediction)] if job.prediction else []
        if self.memory is not None:
            references.append(self.memory.index)
        lookup = NGramProposer(references=references)
        if job.draft == "model":
            draft = self.draft_model
            model = draft_model_of(self.session.proposer)
            assert draft is not None and model is not None, "checked when the request was read"
            model.sampling, model.seed = job.options.sampling, job.seed
            # A prediction feeds lookup whatever the draft; without one, --no-ngram is honoured.
            return LookupThenModel(lookup, draft) if job.prediction or self.session.spec.draft_lookup else draft
        return lookup

    def _policy(self, job: Job, proposer: Proposer):
        # exact: within the exact batch (the server's own --exact is a request's default).
        most = self.exact_batch() - 1 if job.exact else MAX_DRAFT
        costs = self._costs
        if draft_model_of(proposer) is None:
            costs = replace(costs, draft_per_token=0.0)  # n-gram lookup costs next to nothing
        return self.session.draft_policy(job.draft_tokens, proposer=proposer, costs=costs, most=most)

    def exact_batch(self) -> int:
        """The largest bit-identical verify batch with the loaded repacking setting (measured
        once per model and settings, then stored)."""
        if self.session.exact_batch is not None:
            return self.session.exact_batch
        if self._exact_batch is None:
            self._exact_batch = exact_batch_sizes(self.session.spec)
        return self._exact_batch[self.session.spec.target_load.repack]

    def new_seed(self) -> int:
        return int(np.random.SeedSequence().entropy % (1 << 63))

    def close(self) -> None:
        self.closing.set()
        self._thread.shutdown(wait=True)


def sampling_for(temperature: float | None, top_k: int | None, top_p: float | None, min_p: float | None,
                 repeat_penalty: float | None, defaults: SamplingSettings) -> SamplingSettings:
    """A request's sampling: its own fields, else the server's (`specli run`'s defaults)."""
    return SamplingSettings(
        defaults.temperature if temperature is None else temperature,
        defaults.top_k if top_k is None else top_k,
        defaults.top_p if top_p is None else top_p,
        defaults.min_p if min_p is None else min_p,
        defaults.repeat_penalty if repeat_penalty is None else repeat_penalty,
        defaults.repeat_last_n,
    )
