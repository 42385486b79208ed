"""Several generations on one session at once (`specli run --batch`): a thread per slot of the
session's target (decode/slots.py) runs its share of the jobs, each engine built through
`Session.engine_for` and run through `stream`, so every step of the running jobs is one
target decode. A session with one sequence runs the jobs one after the other, each as a
fresh `specli run` would (its whole prompt decoded).

The same jobs write the same text, run after run: job i goes to slot i mod N, every slot
with jobs left stays in the step between its jobs (the next one starts where the last ended,
at a step boundary), and all of them are in from the first step. So each step holds the
same rows in the same sequences whatever the threads' timing, and rounds the same.

An exact request runs alone (Slot's `exclusive`): it writes what `specli run --exact` writes.
A job that fails (a prompt longer than the context, a constraint its model cannot take) is
reported as such and the others go on. Ctrl-C (or the consumer closing the generator) stops
every running job at its next step.
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
            session.clear_cache()  # each prompt decoded whole: the text `specli run` writes for it
            yield _run(session, index, job, None, sink_for(index), lambda: False)
        return
    slots = session.slots[: len(jobs)]
    ended: queue.SimpleQueue[Done] = queue.SimpleQueue()
    stop = threading.Event()

    def work(slot: Slot, mine: range) -> None:
        running = not jobs[mine[0]].request.exact  # begun below, before any thread decodes
        try:
            for index in mine:
                if stop.is_set():
                    break
                job = jobs[index]
                if job.request.exact and running:
                    slot.end()  # it waits for the others to leave the step, then runs alone
                    running = False
                elif not job.request.exact and not running:
                    slot.begin()
                    running = True
                ended.put(_run(session, index, job, slot, sink_for(index), stop.is_set))
        finally:
            if running:
                slot.end()

    shares = [range(start, len(jobs), len(slots)) for start in range(len(slots))]
    for slot, mine in zip(slots, shares):
        if not jobs[mine[0]].request.exact:
            slot.begin()
    threads = [threading.Thread(target=work, args=(slot, mine), name=f"specli-slot-{slot.sequence}", daemon=True)
               for slot, mine in zip(slots, shares)]
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
        engine = session.engine_for(job.request, slot=slot)
        if not job.request.exact:  # the slot is in the step already (run_jobs)
            return Done(index, stream(engine, job.prompt, sink, cancelled=cancelled))
        with slot.running(exclusive=True):
            return Done(index, stream(engine, job.prompt, sink, cancelled=cancelled))
    except Exception as error:  # this job's, reported with it; the others go on
        return Done(index, error=error)
