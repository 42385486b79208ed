"""Constraints: a JSON schema or a grammar that the target's tokens must meet. The only module
that imports llguidance, as backend.py is the only one that imports llama_cpp.

- `Constraint` is what a request asks for, checked when it is made: a schema or grammar
  llguidance cannot use is a ConstraintError that names the place (the keyword's path in the
  schema, or llguidance's own words for a grammar).
- `Vocabulary` is the target's tokens as llguidance reads them, built once per loaded target
  from the GGUF's own vocabulary (token bytes from llama.cpp), so any GGUF works.
- `Matcher` follows one generation through the constraint: which tokens it allows next,
  which single token it forces, and how many of a draft it accepts.

Where the grammar forces bytes (a key, punctuation, the rest of an enum value), llguidance
allows exactly one token: their canonical tokenization. So a forced token is the only one
plain masked decoding can write, and drafting it needs no verification.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import llguidance
import numpy as np
from llguidance import LLMatcher, LLTokenizer

from specli.errors import UsageError


class TokenSource(Protocol):
    """What a Vocabulary reads of the target (backend.Model)."""

    eos: int

    def token_table(self) -> list[tuple[bytes, bool]]: ...
    def tokenizer_handles(self) -> tuple[int, int]: ...
    def end_of_generation_tokens(self) -> list[int]: ...


# JSON is written as Python's json.dumps writes it: ", " between items, ": " after a key,
# and no other whitespace. Fixed separators force more: after a value's closing quote the
# comma, the next key and its ": " are all forced.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class ConstraintError(UsageError):
    """A JSON schema or grammar that cannot constrain a generation (exit 2; serve: 400)."""


@dataclass(frozen=True)
class Constraint:
    """A JSON schema or a grammar (GBNF or Lark), compiled for llguidance when made."""

    kind: Literal["json_schema", "grammar"]
    source: str  # the schema as JSON text, or the grammar's text
    grammar: str = field(compare=False, repr=False)  # llguidance's form of it

    @classmethod
    def json_schema(cls, schema: str | dict | bool, where: str = "JSON schema") -> Constraint:
        """A JSON schema (JSON text or parsed). `where` names it in errors: an option, a field."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except RecursionError:
                raise ConstraintError(f"the {where} nests deeper than {MAX_SCHEMA_DEPTH} levels") from None
            except json.JSONDecodeError as error:
                raise ConstraintError(f"the {where} is not JSON: {error.msg} at line {error.lineno} column {error.colno}",
                                      "give a JSON schema object, e.g. '{\"type\": \"object\"}'") from None
        if schema is True:
            schema = {}
        if not isinstance(schema, dict):
            raise ConstraintError(f"the {where} must be a JSON object, not {type(schema).__name__}")
        if _depth(schema) > MAX_SCHEMA_DEPTH:
            raise ConstraintError(f"the {where} nests deeper than {MAX_SCHEMA_DEPTH} levels",
                                  "name a repeated part once under $defs and $ref it")
        problem = _schema_problem(schema)
        if problem is not None:
            path, message = problem
            raise ConstraintError(f"the {where} is not usable at {_short(path) or '/'}: {message}")
        return cls("json_schema", json.dumps(schema), _compile_schema(schema))

    @classmethod
    def json_object(cls) -> Constraint:
        """Any JSON object (OpenAI's JSON mode)."""
        return cls.json_schema({"type": "object"})

    @classmethod
    def gbnf(cls, text: str, where: str = "grammar") -> Constraint:
        """A grammar in llama.cpp's GBNF (a Lark grammar is taken as well)."""
        if not text.strip():
            raise ConstraintError(f"the {where} is empty")
        try:
            grammar = llguidance.grammar_from("grammar", text)
        except ValueError as error:
            message = str(error).replace("Failed to convert the grammar from GBNF to Lark: ", "")
            raise ConstraintError(f"the {where} is not valid GBNF: {_one_line(message)}", GBNF_HINT) from None
        is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar)
        if is_error:
            raise ConstraintError(f"the {where} is not valid: {_one_line(messages[0])}", GBNF_HINT)
        if not _writes_text(grammar):
            raise ConstraintError(f"the {where} admits only the empty text: it would let nothing be written",
                                  "give root a rule that writes something, e.g. root ::= \"yes\" | \"no\"")
        return cls("grammar", text, grammar)

    def lark_part(self) -> str:
        """A JSON schema constraint as part of a Lark grammar (what calls stand beside)."""
        assert self.kind == "json_schema", "only a JSON schema is written into another grammar"
        return json_lark(json.loads(self.source))

    def after(self, lark: str) -> Constraint:
        """This constraint where a Lark grammar names it `@answer`: what that grammar admits
        before it (a reasoning model's thinking) is not held to it."""
        first, *rest = (json.loads(self.grammar)["grammars"] if self.grammar.lstrip().startswith("{")
                        else [{"lark_grammar": self.grammar}])  # a schema's compiled form, or Lark
        grammar = json.dumps({"grammars": [{"lark_grammar": lark}, {**first, "name": "answer"}, *rest]})
        is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar)
        if is_error:
            raise ConstraintError(f"the {self.kind.replace('_', ' ')} cannot follow the reasoning: "
                                  f"{_one_line(messages[0])}")
        return Constraint(self.kind, self.source, grammar)

    @classmethod
    def lark(cls, text: str, where: str = "grammar") -> Constraint:
        """A grammar in llguidance's Lark (what tool calls are constrained by)."""
        try:
            grammar = LLMatcher.grammar_from_lark(text)
        except ValueError as error:
            raise ConstraintError(f"the {where} is not valid: {_one_line(str(error))}") from None
        is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar)
        if is_error:
            raise ConstraintError(f"the {where} is not valid: {_one_line(messages[0])}")
        return cls("grammar", text, grammar)


GBNF_HINT = "GBNF as llama.cpp reads it: rules like root ::= \"yes\" | \"no\" (llama.cpp's grammars/README.md)"


class _Bytes:
    """A vocabulary of the 256 bytes and an end token: what a grammar admits, whatever the model."""

    eos_token_id, bos_token_id = 256, None
    tokens = [bytes([i]) for i in range(256)] + [b"</s>"]
    special_token_ids = [256]

    def __call__(self, text: bytes) -> list[int]:
        return list(text)


_BYTES: LLTokenizer | None = None


def _writes_text(grammar: str) -> bool:
    """Whether the grammar admits any text but the empty one: at its start, some byte is allowed."""
    global _BYTES
    if _BYTES is None:
        _BYTES = LLTokenizer(llguidance.TokenizerWrapper(_Bytes()), slices=[])
    matcher = LLMatcher(_BYTES, grammar, log_level=0)
    mask = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8)
    return matcher.is_error() or bool(np.unpackbits(mask, bitorder="little")[:256].any())


def json_lark(schema: dict) -> str:
    """A schema as part of a Lark grammar (`%json {...}`), written as a JSON schema constraint
    writes it: JSON_OPTIONS' separators, objects closed and integers bounded (`_prepared`)."""
    return "%json " + json.dumps({**_prepared(schema), "x-guidance": JSON_OPTIONS}, ensure_ascii=False)


# An integer without bounds is held to JSON's safe range, the integers a double holds exactly
# (llama.cpp's schema grammars hold one to 16 digits): otherwise a small model may write zeros
# until the token limit ("timeout_ms": 1000000000...).
SAFE_INTEGER = 2**53 - 1
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")

# Where a schema holds subschemas (JSON Schema 2020-12 and draft 7): one under the key, a list
# of them, or a map of names to them. Every other key's value (const, enum, default...) is data.
_ONE = ("items", "additionalItems", "additionalProperties", "unevaluatedProperties", "unevaluatedItems",
        "contains", "propertyNames", "not", "if", "then", "else")
_LIST = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def _compile_schema(schema: dict) -> str:
    return LLMatcher.grammar_from_json_schema(_prepared(schema), overrides=JSON_OPTIONS)  # type: ignore[arg-type]


def _prepared(schema: dict) -> dict:
    """A copy of the schema as llama.cpp's schema grammars read it: an object that lists
    `properties` without saying `additionalProperties` admits no other key (as OpenAI's
    strict mode requires; `{"type": "object"}` alone stays open), and an integer without
    bounds is held to SAFE_INTEGER's."""
    return _subschemas(schema, closed=True)


def _subschemas(node: Any, closed: bool) -> Any:
    """_prepared's copy of one schema node; `closed`: whether its listed properties close it
    (not for an allOf member, whose siblings may list the other keys)."""
    if not isinstance(node, dict):
        return node
    copy = dict(node)
    for key, value in node.items():
        if key in _ONE and isinstance(value, dict):
            copy[key] = _subschemas(value, True)
        elif key in _LIST and isinstance(value, list):
            copy[key] = [_subschemas(item, key != "allOf") for item in value]
        elif key in _MAP and isinstance(value, dict):
            copy[key] = {name: _subschemas(item, True) for name, item in value.items()}
    if closed and isinstance(copy.get("properties"), dict) and "additionalProperties" not in copy:
        copy["additionalProperties"] = False
    kind = copy.get("type")
    if (kind == "integer" or isinstance(kind, list) and "integer" in kind) and not any(b in copy for b in _BOUNDS):
        copy["minimum"], copy["maximum"] = -SAFE_INTEGER, SAFE_INTEGER
    return copy


def _schema_error(schema: Any) -> str | None:
    """llguidance's objection to a schema, or None."""
    if not isinstance(schema, dict):
        return None
    try:
        grammar = _compile_schema(schema)
    except ValueError as error:
        return str(error)
    is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar)
    return messages[0] if is_error else None


def _schema_problem(schema: dict) -> tuple[str, str] | None:
    """(the JSON pointer of the deepest subschema that fails as the whole does, the message),
    or None when llguidance takes the schema. llguidance's messages name a keyword but not
    where it is, so subschemas are compiled alone, deepest first, to find it."""
    message = _schema_error(schema)
    if message is None:
        return None
    nodes = sorted(_descendants(schema, ""), key=lambda node: -node[0].count("/"))
    for path, node in nodes[:SEARCHED_SUBSCHEMAS]:
        if _schema_error(node) == message:
            return path, _one_line(message)
    return "", _one_line(message)


SEARCHED_SUBSCHEMAS = 256  # a huge schema's error is reported without its place


def _descendants(node: Any, path: str):
    """(JSON pointer, object) for every object nested in `node`, through lists and objects."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        here = f"{path}/{str(key).replace('~', '~0').replace('/', '~1')}"
        if isinstance(value, dict):
            yield here, value
        yield from _descendants(value, here)


MAX_SCHEMA_DEPTH = 128  # objects and lists within each other (what the schema's walks recurse through)
SHOWN_PATH = 100  # a longer JSON pointer is shown by its two ends


def _depth(value: Any) -> int:
    """How deeply objects and lists nest in `value`, without recursion (stops past MAX_SCHEMA_DEPTH)."""
    deepest, stack = 0, [(value, 1)]
    while stack and deepest <= MAX_SCHEMA_DEPTH:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def _short(path: str) -> str:
    """A JSON pointer of at most about SHOWN_PATH characters: its start and its end."""
    if len(path) <= SHOWN_PATH:
        return path
    return path[: SHOWN_PATH // 3].rsplit("/", 1)[0] + "/…" + "/" + path[-2 * SHOWN_PATH // 3:].split("/", 1)[-1]


def _one_line(text: str) -> str:
    return " ".join(text.split())


class Vocabulary:
    """The target's tokens as llguidance reads them: each token's bytes (control tokens
    marked), its end-of-generation tokens, and llama.cpp's own tokenizer for forced text.
    Built once per loaded target (about a second for a 262k vocabulary)."""

    def __init__(self, target: TokenSource) -> None:
        tokens = [b"\xff" + piece if special else piece for piece, special in target.token_table()]
        vocab, tokenize = target.tokenizer_handles()
        self.size = len(tokens)
        self._target = target  # tokenizer_handles are valid while it is loaded
        self.tokenizer = LLTokenizer.from_llamacpp(  # type: ignore[attr-defined]
            tokens=tokens, vocab_ptr=vocab, tokenize_fptr=tokenize,
            eos_token=target.end_of_generation_tokens() or [target.eos], slices=None)


class Matcher:
    """One generation's place in a constraint. Tokens are consumed as they are committed or
    accepted; a generation starts again with `reset`.

    A constraint may force text that never ends (`root ::= "a" root`, a schema whose object
    requires itself): it is written as plain masked decoding writes it, token by token until
    the token limit. A forced run longer than LONG_RUN tokens is computed once and handed out
    token by token. After computing so long a run, or the mask before it, llguidance's parser
    may refuse the next token (its item limit): the matcher is then rebuilt at the same place
    (the tokens consumed so far, consumed again) and takes it. Where llguidance gives up
    computing a run at all, the matcher is rebuilt likewise and forces nothing more: the mask
    still allows exactly the tokens plain decoding may write."""

    def __init__(self, vocabulary: Vocabulary, constraint: Constraint) -> None:
        self.constraint = constraint
        self._vocabulary = vocabulary
        self._size = vocabulary.size
        self._matcher = self._new_matcher()
        self._consumed: list[int] = []  # the tokens consumed since the last reset, for a rebuild
        self._forces = True  # False once llguidance has given up on a forced run
        self._run: list[int] = []  # a long forced run, reversed: the next forced token last
        # The mask of the current state, one bit per token id: computed into this one buffer
        # at most once per state (consume, rollback and reset make it stale).
        self._words = np.zeros((vocabulary.size + 31) // 32, dtype=np.uint32)
        self._fresh = False

    def _new_matcher(self) -> LLMatcher:
        matcher = LLMatcher(self._vocabulary.tokenizer, self.constraint.grammar, log_level=0)
        if matcher.is_error():
            raise ConstraintError(f"the {self.constraint.kind.replace('_', ' ')} cannot be used: "
                                  f"{_one_line(matcher.get_error())}")
        return matcher

    def reset(self) -> None:
        self._matcher.reset()
        self._consumed.clear()
        self._run.clear()
        self._fresh = False

    @property
    def stopped(self) -> bool:
        """Nothing but the end of generation can follow: the structure is complete."""
        return self._matcher.is_stopped()

    def forced(self) -> int | None:
        """The one token the constraint allows next, where it forces bytes; else None."""
        if self._run:
            return self._run[-1]
        if not self._forces:
            return None
        tokens = self._matcher.compute_ff_tokens()
        if self._matcher.is_error():  # llguidance gave up on an endless run: from here, masks only
            self._forces = False
            self._rebuild()
            return None
        if len(tokens) > LONG_RUN:
            self._run = tokens[::-1]
        return tokens[0] if tokens else None

    def _rebuild(self) -> None:
        """A fresh llguidance matcher at the same place: the tokens consumed so far, consumed again."""
        self._fresh = False
        self._matcher = self._new_matcher()
        if self._consumed and not self._matcher.consume_tokens(self._consumed):
            raise RuntimeError(f"the constraint refused its own tokens again: {self._matcher.get_error()}")

    def allows(self, token: int) -> bool:
        """Whether the mask allows `token` next. (Not validate_tokens: where bytes are forced,
        the grammar admits any spelling of them but the mask only their canonical token.)"""
        return bool(int(self._bits()[token >> 5]) >> (token & 31) & 1)

    def valid_prefix(self, tokens: list[int]) -> int:
        """How many of `tokens`, in order from here, the grammar admits (none consumed). A
        non-canonical spelling of forced bytes passes here and is rejected by verification."""
        return self._matcher.validate_tokens(tokens) if tokens else 0

    def mask(self) -> np.ndarray:
        """A bool per token id: allowed next."""
        return np.unpackbits(self._bits().view(np.uint8), bitorder="little")[: self._size].view(bool)

    def _bits(self) -> np.ndarray:
        if not self._fresh:
            self._matcher.unsafe_compute_mask_ptr(self._words.ctypes.data, self._words.nbytes)
            self._fresh = True
        return self._words

    def restrict(self, row: np.ndarray) -> np.ndarray:
        """The logits row with every token the constraint forbids at -inf (a copy)."""
        return np.where(self.mask(), row, -np.inf).astype(row.dtype, copy=False)

    def consume(self, token: int) -> None:
        self._fresh = False
        if self._run:
            if self._run[-1] == token:
                self._run.pop()
            else:
                self._run.clear()
        if not self._matcher.consume_token(token):
            self._rebuild()  # a parser left full by an endless run's mask or forced bytes: afresh, once
            if not self._matcher.consume_token(token):
                raise RuntimeError(f"the constraint refused token {token}: {_one_line(self._matcher.get_error())}")
        self._consumed.append(token)

    def rollback(self, count: int) -> None:
        if count > 0:
            self._fresh = False
            self._run.clear()
            self._matcher.rollback(count)
            del self._consumed[-count:]


# A forced run longer than this (a constraint whose forced text never ends, or a very long
# const) is computed once, not again for each of its tokens: computing one costs time in its length.
LONG_RUN = 256
