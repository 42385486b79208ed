"""--exact's verify batches along the context (specli/decode/exact.py).

- BatchCap: a batch never has more rows than the span it starts in allows, and never crosses
  that span's end; past the spans measured, one row; a stored cap of an earlier format is
  measured again.
- measure_cap, on a fake decoder that rounds a batch otherwise past a depth, or where some of
  its rows ask for no logits: the cap finds both.
- On Gemma 3 270M, the issue's case: a prompt past 256 tokens under a schema with forced runs;
  --exact with drafting writes --exact --draft none's ids (on this CPU build a batch of rows
  past the KV cache's first 256 cells rounds otherwise than one-token decodes do).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from helpers import traced

from specli.decode.constraint import Constraint
from specli.decode.exact import BatchCap, measure_cap
from specli.decode.request import DraftKind, GenerationRequest
from specli.llama.backend import LoadSettings
from specli.session import SessionSpec, open_session


def test_a_batch_keeps_to_the_span_it_starts_in():
    cap = BatchCap(((0, 256, 3), (256, 1024, 1), (1024, 4096, 2)))
    assert [cap.at(p) for p in (0, 252, 253, 254, 255, 256, 1023, 1024, 4094, 4095)] == [3, 3, 3, 2, 1, 1, 1, 2, 2, 1]
    assert cap.at(4096) == 1 and cap.at(10**6) == 1, "past the spans measured: one row"
    assert cap.largest == 3 and cap.measured == 4096
    assert cap.describe() == "3 rows at positions 0-255, 1 row at 256-1023, 2 rows at 1024-4095"
    assert BatchCap.from_json(cap.to_json()) == cap and BatchCap.from_report(cap.report()) == cap
    assert BatchCap.anywhere(9).at(10**9) == 9


@pytest.mark.parametrize("stored", [3, [], [[0, 256, 3], [300, 400, 1]], [[1, 256, 3]], [[0, 256, 0]], "3"])
def test_a_stored_cap_of_another_format_is_measured_again(stored):
    assert BatchCap.from_json(stored) is None


class RoundingDecoder:
    """Logits that depend on the tokens before each row only, except that a batch of more than
    `exact_rows` rows, or one reaching position `depth` or past, or one in which a row asks
    for no logits (`skipped_rounds`), rounds its rows otherwise."""

    n_ctx = 512

    def __init__(self, exact_rows: int = 9, depth: int = 10**9, skipped_rounds: bool = False) -> None:
        self.exact_rows, self.depth, self.skipped_rounds = exact_rows, depth, skipped_rounds
        self.tokens: list[int] = []

    def tokenize(self, text, *, add_special=True, parse_special=False):
        return [ord(c) % 50 for c in text]

    def rewind(self, n_keep):
        del self.tokens[n_keep:]

    def decode(self, tokens, *, all_logits=False, outputs=None):
        first = len(self.tokens)
        self.tokens += tokens
        rows = [np.full(8, float(hash(tuple(self.tokens[: first + i + 1])) % 1000)) for i in range(len(tokens))]
        off = len(tokens) > 1 and (len(tokens) > self.exact_rows or first + len(tokens) > self.depth
                                   or (self.skipped_rounds and outputs is not None and not all(outputs)))
        if off:
            rows = [row + 0.5 for row in rows]
        if outputs is not None:
            return np.array([row for row, out in zip(rows, list(outputs[:-1]) + [True]) if out])
        return np.array(rows if all_logits else rows[-1:])


def test_the_measurement_finds_the_depth_where_batches_stop_being_exact():
    cap = measure_cap(RoundingDecoder(exact_rows=4, depth=256), 9)
    assert cap.spans == ((0, 256, 4), (256, 512, 1))


def test_the_measurement_covers_rows_that_ask_for_no_logits():
    assert measure_cap(RoundingDecoder(exact_rows=5), 9).spans == ((0, 256, 5), (256, 512, 5))
    assert measure_cap(RoundingDecoder(exact_rows=5, skipped_rounds=True), 9).spans == ((0, 256, 1), (256, 512, 1))


# The case: three nginx log lines (278 tokens of prompt on Gemma 3), then a schema of
# up to 5 objects of 8 required fields each: the grammar forces each object's keys.
LOG_PROMPT = (
    "Here is an excerpt of an nginx access log from our web server, copied exactly as it was written:\n"
    '203.0.113.7 - - [14/Mar/2026:10:15:32 +0000] "GET /api/v1/orders?page=2&limit=50 HTTP/1.1" 200 5123 '
    '"https://shop.example.com/orders" "Mozilla/5.0 (X11; Linux x86_64; rv:124.0) Gecko/20100101 Firefox/124.0"\n'
    '198.51.100.23 - - [14/Mar/2026:10:15:33 +0000] "POST /api/v1/cart/items HTTP/1.1" 201 312 '
    '"https://shop.example.com/product/4411" "Mozilla/5.0 (Macintosh; Intel Mac OS X 14_4) AppleWebKit/605.1.15 '
    '(KHTML, like Gecko) Version/17.4 Safari/605.1.15"\n'
    '192.0.2.144 - - [14/Mar/2026:10:15:35 +0000] "DELETE /api/v1/sessions/9f2c1e77 HTTP/1.1" 404 87 '
    '"-" "curl/8.6.0"\n\n'
    "List every request in the log above as JSON: for each one give the client address, the time, the HTTP "
    "method, the path, the protocol, the status code, the size of the response in bytes and the user agent.\n"
)
LOG = {
    "type": "object",
    "properties": {"requests": {"type": "array", "maxItems": 5, "items": {
        "type": "object",
        "properties": {"client": {"type": "string"}, "time": {"type": "string"},
                       "method": {"type": "string", "enum": ["GET", "POST", "PUT", "DELETE", "PATCH"]},
                       "path": {"type": "string"}, "protocol": {"type": "string"}, "status": {"type": "integer"},
                       "bytes": {"type": "integer"}, "agent": {"type": "string"}},
        "required": ["client", "time", "method", "path", "protocol", "status", "bytes", "agent"],
        "additionalProperties": False}}},
    "required": ["requests"],
    "additionalProperties": False,
}


class RowLog:
    """Every logits row the target returns, by the tokens its position read (a row of a
    rejected draft has another context than plain decoding's rows, so it matches none)."""

    def __init__(self, target) -> None:
        self.target, self.decode = target, target.decode
        self.kept: list[int] = []  # the KV cache's tokens, as this log saw them
        self.rows: dict[tuple[int, ...], bytes] = {}

    def __call__(self, tokens, *, all_logits=False, outputs=None):
        first = self.target.n_past
        rows = self.decode(tokens, all_logits=all_logits, outputs=outputs)
        self.kept = self.kept[:first] + list(tokens)
        asked = [True] * len(tokens) if all_logits else [False] * (len(tokens) - 1) + [True]
        if outputs is not None:
            asked = [bool(flag) for flag in outputs[:-1]] + [True]
        positions = [first + i for i, flag in enumerate(asked) if flag]
        for position, row in zip(positions, rows):
            self.rows[tuple(self.kept[: position + 1])] = np.asarray(row).tobytes()
        return rows


@pytest.mark.slow
def test_exact_past_256_tokens_under_a_schema_reads_plain_decodings_rows(gemma_path):
    """Every logits row a drafted --exact run reads is bit for bit the row plain decoding reads
    after the same tokens (so no near-tie can part them), and the ids are the same. As a
    served request is: the loaded repacking setting's cap, measured on first use."""
    load = LoadSettings(ctx_size=1024)
    request = GenerationRequest(max_tokens=100, exact=True, constraint=Constraint.json_schema(LOG))
    with open_session(SessionSpec(gemma_path, None, load, load)) as session:
        tokens = session.target.tokenize(LOG_PROMPT)
        assert len(tokens) > 256
        session.exact()  # measured before the target's decodes are logged
        logs = {}
        for draft, draft_tokens in ((DraftKind.NONE, "auto"), (DraftKind.NGRAM, 2), (DraftKind.NGRAM, "auto")):
            log = logs[draft, draft_tokens] = RowLog(session.target)
            session.target.decode = log
            session.clear_cache()
            try:
                log.ids = traced(session, tokens, replace(request, draft=draft, draft_tokens=draft_tokens))[0]
            finally:
                del session.target.decode  # the class's own again
    plain = logs.pop((DraftKind.NONE, "auto"))
    for name, log in logs.items():
        assert log.ids == plain.ids, name
        shared = log.rows.keys() & plain.rows.keys()
        assert len(shared) > len(plain.ids) // 2, name
        assert all(log.rows[key] == plain.rows[key] for key in shared), name
