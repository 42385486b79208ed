"""The one consumer of engine events: run, chat, bench and serve drive every generation
through `stream`.

It hands each event to a sink (a renderer, bench's timer, the server's response), keeps
the step records, and ends a generation the same way whatever stops it: its own end,
Ctrl-C, the caller's `cancelled` (a client that went away), an exception in the sink, or
an RPC server that goes away mid-run (ggml then ends the process: the text so far is
flushed to the sink first).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

from specli.decode.engine import Engine
from specli.decode.events import Finished, Stats, StepRecord, Token
from specli.decode.logprobs import TokenLogprob
from specli.decode.media import PromptMedia
from specli.llama import backend, rpc


class Sink(Protocol):
    """Where a generation's events go."""

    def start(self) -> None: ...
    def token(self, event: Token) -> None: ...
    def step(self, record: StepRecord) -> None:
        """After the tokens a step committed (a renderer flushes here)."""
        ...

    def finish(self, stats: Stats) -> None:
        """Once, at the end, whatever ended it (stats.finish_reason says what)."""
        ...


@dataclass
class Outcome:
    """What a generation wrote and how it went."""

    stats: Stats
    tokens: list[int] = field(default_factory=list)  # the committed token ids
    text: str = ""  # the released text (stop strings and what follows them left out)
    # (text, source, proposer): text joined by who wrote it (proposer: "" for the target's)
    spans: list[tuple[str, str, str]] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    # (token id, its logprob) for each committed token, where the request asked for logprobs
    logprobs: list[tuple[int, TokenLogprob]] = field(default_factory=list)
    waited: float = 0.0  # seconds it waited for its turn before it started (a server's queue)


def stream(engine: Engine, prompt: list[int], sink: Sink, *,
           cancelled: Callable[[], bool] | None = None, media: PromptMedia | None = None) -> Outcome:
    """Generate from `prompt` (with its images: `media`), handing every event to `sink`.
    `cancelled` is asked after each step: True ends the generation there (finish_reason
    "cancelled"). Ctrl-C ends it too ("interrupted"); the caller decides the exit code. The
    prompt is checked against the context here, once, before the sink hears anything."""
    events = engine.generate(prompt, media)
    outcome = Outcome(engine.stats)
    graphs = backend.cuda_graph_events()
    pieces: list[tuple[str, str, str]] = []  # (text, source, proposer) of every token that released text

    def flush_partial() -> None:  # an RPC server went away: what was generated still shows
        engine.stats.finish_reason = "error"
        sink.finish(engine.stats)

    with rpc.on_fault(flush_partial):
        try:
            sink.start()
            for event in events:
                if isinstance(event, Token):
                    if event.id >= 0:
                        outcome.tokens.append(event.id)
                    if event.logprob is not None:
                        outcome.logprobs.append((event.id, event.logprob))
                    if event.text:
                        pieces.append((event.text, event.source, event.proposer))
                    sink.token(event)
                elif isinstance(event, StepRecord):
                    outcome.steps.append(event)
                    sink.step(event)
                    if cancelled is not None and cancelled():
                        events.close()  # the engine's own cleanup runs: the stats get their timings
                        engine.stats.finish_reason = "cancelled"
                        break
                elif isinstance(event, Finished):
                    break
        except KeyboardInterrupt:
            events.close()
            engine.stats.finish_reason = "interrupted"
        except BaseException:
            events.close()
            raise
        outcome.stats = engine.stats
        after = backend.cuda_graph_events()
        if any(after.values()):  # a GPU build that logged its graphs
            outcome.stats.cuda_graphs = {event: after[event] - graphs[event] for event in after}
        outcome.text = "".join(piece[0] for piece in pieces)
        outcome.spans = spans_of(pieces)
        sink.finish(engine.stats)
    return outcome


def spans_of(pieces: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """Consecutive pieces of one source and proposer joined: (text, source, proposer) runs."""
    spans: list[tuple[str, str, str]] = []
    start = 0
    for i in range(1, len(pieces) + 1):
        if i == len(pieces) or pieces[i][1:] != pieces[start][1:]:
            spans.append(("".join(piece[0] for piece in pieces[start:i]), *pieces[start][1:]))
            start = i
    return spans
