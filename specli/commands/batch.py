"""`specli run --batch FILE`: a prompt a line, generated N at a time by one batched engine
(specli/parallel.py), JSON Lines out in input order.

A line is a prompt as `specli run` takes one, or a JSON object (a line that starts with `{`):
`{"prompt": "...", "n": 64, "json_schema": {...}, "seed": 7}`, every key but `prompt` optional.
Blank lines are skipped. Each record says its `line`; a line that cannot run (bad JSON, an
unknown key, a schema llguidance refuses, a prompt the context cannot hold) gets an `error`
record in its place and one line on stderr, and the others still run. The exit code is 1 if
any line failed, 130 on Ctrl-C (the records written so far stay), else 0.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Callable

from specli.decode.constraint import Constraint
from specli.decode.engine import check_prompt_fits
from specli.decode.events import Stats
from specli.decode.request import GenerationRequest
from specli.errors import SpecliError, UsageError
from specli.parallel import Done, Job, run_jobs
from specli.prompt import prompt_tokens
from specli.session import Session, SessionSpec, open_session

KEYS = {"prompt", "n", "json_schema", "seed"}
EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130


@dataclass(frozen=True)
class Line:
    number: int  # 1-based, in the file
    text: str


def read_lines(path: Path, stdin: IO[str]) -> list[Line]:
    """The file's (or stdin's, for -) non-blank lines, numbered as an editor numbers them."""
    try:
        raw = stdin.read() if str(path) == "-" else path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"--batch {path}: {getattr(error, 'strerror', None) or error}") from None
    lines = [Line(number, text) for number, text in enumerate(raw.splitlines(), 1) if text.strip()]
    if not lines:
        raise UsageError(f"--batch {path}: no prompt in it", "one prompt a line, or JSON Lines with a prompt each")
    return lines


def job_for(line: Line, session: Session, request: GenerationRequest, system: str | None,
            chat: bool | None) -> Job:
    """The line's prompt and request (its own n, schema and seed over the command's)."""
    fields: dict = {"prompt": line.text}
    if line.text.lstrip().startswith("{"):
        try:
            fields = json.loads(line.text)
        except json.JSONDecodeError as error:
            raise SpecliError(f"not JSON: {error.msg} at column {error.colno}") from None
        if not isinstance(fields, dict) or not isinstance(fields.get("prompt"), str) or not fields["prompt"]:
            raise SpecliError('a JSON line needs a "prompt" string')
        unknown = sorted(set(fields) - KEYS)
        if unknown:
            raise SpecliError(f"unknown key {unknown[0]!r} (keys: {', '.join(sorted(KEYS))})")
    changes: dict = {}
    if "n" in fields:
        if not isinstance(fields["n"], int) or isinstance(fields["n"], bool) or fields["n"] <= 0:
            raise SpecliError('"n" must be a whole number above 0')
        changes["max_tokens"] = fields["n"]
    if "seed" in fields:
        if not isinstance(fields["seed"], int) or isinstance(fields["seed"], bool) or fields["seed"] < 0:
            raise SpecliError('"seed" must be a whole number, 0 or more')
        changes["seed"] = fields["seed"]
    if "json_schema" in fields:
        changes["constraint"] = Constraint.json_schema(fields["json_schema"], '"json_schema"')
    tokens = prompt_tokens(session.target, fields["prompt"], system=system, chat=chat)
    check_prompt_fits(len(tokens), session.target.n_ctx)
    return Job(tokens, replace(request, **changes))


def run_batch(spec: SessionSpec, lines: list[Line], request: GenerationRequest, *, system: str | None,
              chat: bool | None, stdout: IO[str], notice: Callable[[str], None]) -> int:
    """Run every line, writing its record in input order; the summary goes to `notice`."""
    failed = 0
    with open_session(spec, notice) as session:
        jobs: list[Job] = []
        records: dict[int, dict] = {}  # by position in `lines`: the records ready to write
        runnable: list[int] = []  # positions of the lines that run, in the order of `jobs`
        for position, line in enumerate(lines):
            try:
                jobs.append(job_for(line, session, request, system, chat))
                runnable.append(position)
            except SpecliError as error:
                records[position] = _failed(line, error, notice)
                failed += 1
        written, started, stats = 0, time.perf_counter(), []
        try:
            for done in run_jobs(session, jobs):
                position = runnable[done.index]
                records[position] = _record(lines[position], done, notice)
                failed += done.error is not None
                if done.outcome is not None:
                    stats.append(done.outcome.stats)
                while written in records:  # in input order, as soon as the lines before are out
                    stdout.write(json.dumps(records.pop(written), ensure_ascii=False) + "\n")
                    written += 1
                stdout.flush()
        except KeyboardInterrupt:
            return EXIT_INTERRUPTED
        while written in records:
            stdout.write(json.dumps(records.pop(written), ensure_ascii=False) + "\n")
            written += 1
        notice(summary(len(lines), failed, len(session.slots) or 1, stats, time.perf_counter() - started))
    return EXIT_FAILED if failed else EXIT_OK


def _record(line: Line, done: Done, notice: Callable[[str], None]) -> dict:
    if done.error is not None:
        error = done.error if isinstance(done.error, SpecliError) else SpecliError(str(done.error))
        return _failed(line, error, notice)
    assert done.outcome is not None
    stats = done.outcome.stats
    return {"line": line.number, "text": done.outcome.text, "finish_reason": stats.finish_reason,
            "stats": stats.to_dict()}


def _failed(line: Line, error: SpecliError, notice: Callable[[str], None]) -> dict:
    notice(f"line {line.number}: {error.message}")
    return {"line": line.number, "error": error.message}


def summary(lines: int, failed: int, at_once: int, stats: list[Stats], seconds: float) -> str:
    """One line for stderr: what ran, how fast in all, how the drafts did."""
    total = Stats.combine(stats)
    rate = total.tokens / seconds if seconds > 0 else 0.0
    said = f"{lines} prompts, {at_once} at a time: {total.tokens} tokens in {seconds:.1f} s, {rate:.1f} tok/s in all"
    if total.drafted:
        said += f"; drafted {total.drafted}, accepted {total.accepted} ({100 * total.acceptance_rate:.0f}%)"
    return said + (f"; {failed} failed" if failed else "")
