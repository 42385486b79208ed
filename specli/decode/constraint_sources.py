"""Where a generation's constraint comes from, and the one rule for which sources combine.

A constraint is written from what the user gave: the CLI's --grammar, --grammar-file, -j and
-jf, or a served request's response_format, json_schema, grammar and tools. Each layer names
its sources as the user spelled them; `write_constraint` refuses the pairs that may not go
together (one SourceConflict, one message) and then writes the constraint from the rest.
A request's tools combine with its JSON response format: the answer is then either calls or
JSON under that schema, as the tools' source writes it (its `make` takes the answer's constraint).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Callable, Sequence

from specli.decode.constraint import Constraint
from specli.errors import UsageError


class SourceKind(Enum):
    GRAMMAR = "grammar"
    JSON = "json"  # a JSON schema, or JSON mode
    TOOLS = "tools"  # a served request's tools: their calls' grammar
    TEXT = "text"  # a response format of plain text: no constraint of its own


# The kinds one request may give together; any other two given together are refused. Apart
# from TOOLS, each pair holds at most one constraint (TEXT adds none): the answer's.
COMBINE: frozenset[frozenset[SourceKind]] = frozenset({
    frozenset({SourceKind.TEXT, SourceKind.JSON}),
    frozenset({SourceKind.TEXT, SourceKind.GRAMMAR}),
    frozenset({SourceKind.TEXT, SourceKind.TOOLS}),
    frozenset({SourceKind.JSON, SourceKind.TOOLS}),
})


@dataclass(frozen=True)
class ConstraintSource:
    name: str  # as the user gave it: "--grammar", "response_format", "tools"
    kind: SourceKind
    # None: it constrains nothing. A TOOLS source's make takes the answer's constraint (or None).
    make: Callable[..., Constraint | None] = field(compare=False, repr=False)


class SourceConflict(UsageError):
    """Two constraint sources that may not go together (exit 2; serve: 400 naming `name`)."""

    def __init__(self, message: str, name: str) -> None:
        super().__init__(message)
        self.name = name


def check_sources(sources: Sequence[ConstraintSource]) -> None:
    """SourceConflict for the first pair, in the order given, that COMBINE does not allow."""
    for i, second in enumerate(sources):
        for first in sources[:i]:
            if frozenset({first.kind, second.kind}) not in COMBINE:
                raise _conflict(first, second, sources)


def _conflict(first: ConstraintSource, second: ConstraintSource,
              sources: Sequence[ConstraintSource]) -> SourceConflict:
    tools = next((source for source in (first, second) if source.kind is SourceKind.TOOLS), None)
    if tools is not None:  # only a served request has tools; its other sources are these fields
        other = second if tools is first else first
        return SourceConflict(f"tools do not combine with {other.name} (a grammar); a JSON schema or "
                              "json_object response format does", other.name)
    named = ", ".join(source.name for source in sources if source.kind is not SourceKind.TEXT)
    return SourceConflict(f"give one of {named}, not several", second.name)


def write_constraint(sources: Sequence[ConstraintSource]) -> Constraint | None:
    """The constraint the sources give, once they are known to combine: the answer's (each
    source made, read, checked and compiled, in the order given, its errors its own), then
    the tools' around it."""
    check_sources(sources)
    tools = [source for source in sources if source.kind is SourceKind.TOOLS]
    answers = [source for source in sources if source.kind is not SourceKind.TOOLS]
    made = [constraint for constraint in (source.make() for source in answers) if constraint is not None]
    assert len(made) <= 1 and len(tools) <= 1, "COMBINE pairs hold one answer's constraint"
    answer = made[0] if made else None
    return tools[0].make(answer) if tools else answer
