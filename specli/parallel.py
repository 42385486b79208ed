"""Several generations on one session at once (`specli run --batch`): a thread per slot of the
session's target (decode/slots.py) takes the next job, builds its engine through
`Session.engine_for` and runs it through `stream`, so every step of the running jobs is one
target decode. A session with one sequence runs the jobs one after the other.

An exact request runs alone (Slot.running's `exclusive`): it writes what `specli run --exact`
writes. A job that fails (a prompt longer than the context, a constraint its model cannot
take) is reported as such and the others go on. Ctrl-C (or the consumer closing the
generator) stops every running job at its next step.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

from specli.decode.events import Stats, StepRecord, Token
from specli.decode.request import GenerationRequest
from specli.decode.slots import Slot
from specli.session import Session
from specli.stream import Outcome, Sink, stream


@dataclass(frozen=True)
class Job:
    prompt: list[int]
    request: GenerationRequest


@dataclass
class Done:
    """A job's end: its outcome, or the error that ended it."""

    index: int
    outcome: Outcome | None = None
    error: Exception | None = None


class Quiet:
    """A sink that keeps nothing (the outcome has the text, the spans and the stats)."""

    def start(self) -> None: ...
    def token(self, event: Token) -> None: ...
    def step(self, record: StepRecord) -> None: ...
    def finish(self, stats: Stats) -> None: ...


def run_jobs(session: Session, jobs: Sequence[Job], *,
             sink_for: Callable[[int], Sink] = lambda index: Quiet()) -> Iterator[Done]:
    """Run every job, as many at once as the session has slots; yield each as it ends."""
    if not session.slots:
        for index, job in enumerate(jobs):
            yield _run(session, index, job, None, sink_for(index), lambda: False)
        return
    todo: queue.SimpleQueue[int] = queue.SimpleQueue()
    for index in range(len(jobs)):
        todo.put(index)
    ended: queue.SimpleQueue[Done] = queue.SimpleQueue()
    stop = threading.Event()

    def work(slot: Slot) -> None:
        while not stop.is_set():
            try:
                index = todo.get_nowait()
            except queue.Empty:
                return
            ended.put(_run(session, index, jobs[index], slot, sink_for(index), stop.is_set))

    threads = [threading.Thread(target=work, args=(slot,), name=f"specli-slot-{slot.sequence}", daemon=True)
               for slot in session.slots[: len(jobs)]]
    for thread in threads:
        thread.start()
    try:
        for _ in range(len(jobs)):
            yield ended.get()
    finally:
        stop.set()
        for thread in threads:
            thread.join()


def _run(session: Session, index: int, job: Job, slot: Slot | None, sink: Sink,
         cancelled: Callable[[], bool]) -> Done:
    try:
        if slot is None:
            return Done(index, stream(session.engine_for(job.request), job.prompt, sink, cancelled=cancelled))
        with slot.running(exclusive=job.request.exact):
            engine = session.engine_for(job.request, slot=slot)
            return Done(index, stream(engine, job.prompt, sink, cancelled=cancelled))
    except Exception as error:  # this job's, reported with it; the others go on
        return Done(index, error=error)
