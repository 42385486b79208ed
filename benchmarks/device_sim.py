"""A simulated accelerator behind specli.llama.backend.Model's interface, so that the host's
own cost of a generation can be measured on a machine without a GPU (benchmarks/host_overhead.py)
and the engine tested on a model that writes a known text (tests/test_host_overhead.py).

`SimulatedModel` decodes nothing. Each decode is priced in simulated device seconds, which
it adds to its `Ledger` and never sleeps for:
- the decode itself, by the number of tokens in the batch, from a measured curve (by default
  an 8B-shaped F16 model on an NVIDIA H200, after 512 tokens, llama-bench 2026-11-26);
- copying the output rows to the host (n_vocab float32s each, at COPY_GBPS);
- CUDA graphs as llama.cpp's CUDA backend keeps them (ggml-cuda.cu, 0.3.36): one graph per
  context; a decode whose shape (tokens, outputs, sampler) differs from the last one's runs
  without a graph (GRAPHLESS_MS more, its kernels launched one by one), the next one of the same
  shape captures it (CAPTURE_MS more), and later ones of that shape replay it;
- decode_argmax: the device's top-k sampler per decode (SAMPLER_MS, measured on the H200);
  decode_greedy: its argmax (GREEDY_MS, an assumption: one small reduction kernel).
The wall time spent inside its device calls (the rows it writes, its KV bookkeeping) is kept
apart in the ledger (`inside_seconds`), so a harness can take it off the wall time and be left
with the host's own work. What backend.Model does in Python around llama_decode (filling the
batch's arrays, slicing the output buffer) is done here too, outside that time.

What each row says comes from a seeded `Script`: the target's text is a fixed random token
sequence (prompt, then answer) with spans copied from earlier in it, so n-gram lookup finds
matches; a draft model agrees with the target at each position with a fixed chance. A model
follows the script only while its KV cache holds the script's tokens: after any other token
it writes a token derived from that token and its position, so a cache that is not kept in
step shows as other text. Rows are real vocabulary-sized float32 rows in one output buffer,
reused and grown as llama.cpp's is; only the entry that makes a row's argmax changes between
decodes.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Sequence

import numpy as np

DEFAULT_VOCAB = 152_064  # Qwen2.5's vocabulary
# One decode of an 8B-shaped F16 target by tokens in the batch (every row out), in ms: an NVIDIA
# H200 after 512 tokens (llama-bench, benchmarks/gpu/run.sh, 2026-11-26; vocabulary 128,256).
H200_8B_MS = {1: 6.295, 2: 8.416, 3: 8.185, 4: 8.261, 5: 8.357, 6: 8.503, 7: 8.520, 8: 8.812, 9: 9.225,
              10: 9.279, 12: 9.287, 14: 9.420, 16: 9.471, 20: 10.593, 24: 10.010, 32: 10.164, 40: 10.637,
              48: 10.603, 49: 10.490}
# Assumptions, not measured: the 8B shape's 2-layer F16 draft decodes one token in 0.45 ms (about
# 1/14 of the target's), its curve the target's scaled to that; output rows cross to the host
# at 25 GB/s; a decode without its graph costs 0.3 ms more (the target's ~450 kernels launched
# one by one, mostly hidden behind its 6 ms of work), and capturing one 0.5 ms; the draft's
# both scaled with its one-token decode.
DRAFT_ONE_TOKEN_MS = 0.45
COPY_GBPS = 25.0
GRAPHLESS_MS = 0.3
CAPTURE_MS = 0.5
SAMPLER_MS = 0.94  # the target's top-k device sampler per decode (--verify-on-device), H200 2026-11-26
GREEDY_MS = 0.02  # a greedy device sampler (one argmax kernel) per decode: an assumption
HIGH_LOGIT = 30.0  # a row's chosen token; every other entry lies in [0, 1): a near one-hot row
FIRST_TOKEN = 2  # ids 0 (BOS) and 1 are never in a script; EOS is n_vocab - 1


@dataclass(frozen=True)
class DeviceCosts:
    """What one model's decodes cost on the simulated device, in seconds."""

    curve: tuple[tuple[int, float], ...]  # (tokens in the batch, seconds), a steady shape
    copy_gbps: float = COPY_GBPS  # output rows to the host; 0: free
    graphless: float = GRAPHLESS_MS / 1000  # a decode without its graph: after a change of shape
    capture: float = CAPTURE_MS / 1000  # the second decode of a shape in a row: it captures the graph
    sampler: float = SAMPLER_MS / 1000  # decode_argmax's device sampler, per decode
    greedy: float = GREEDY_MS / 1000  # decode_greedy's, per decode

    def decode(self, tokens: int) -> float:
        """A decode of `tokens`: the curve, linear between its points; past its last point, along
        the line through its first and last (a prompt's chunks: outside the measured window)."""
        sizes = [size for size, _ in self.curve]
        seconds = [cost for _, cost in self.curve]
        if tokens <= sizes[-1]:
            return float(np.interp(tokens, sizes, seconds))
        slope = (seconds[-1] - seconds[0]) / max(sizes[-1] - sizes[0], 1)
        return seconds[-1] + slope * (tokens - sizes[-1])

    def copy(self, rows: int, n_vocab: int) -> float:
        return 0.0 if self.copy_gbps <= 0 else rows * n_vocab * 4 / (self.copy_gbps * 1e9)

    def scaled(self, one_token: float) -> DeviceCosts:
        """The same curve's shape with one token costing `one_token` seconds."""
        factor = one_token / self.curve[0][1]
        return replace(self, curve=tuple((size, cost * factor) for size, cost in self.curve),
                       graphless=self.graphless * factor, capture=self.capture * factor)


def h200_costs(*, draft: bool = False, draft_ms: float = DRAFT_ONE_TOKEN_MS, copy_gbps: float = COPY_GBPS,
               graphless_ms: float = GRAPHLESS_MS, capture_ms: float = CAPTURE_MS) -> DeviceCosts:
    """The 8B-shaped target's costs on the H200, or (draft) its draft's."""
    costs = DeviceCosts(tuple((size, ms / 1000) for size, ms in sorted(H200_8B_MS.items())), copy_gbps,
                        graphless_ms / 1000, capture_ms / 1000)
    return costs.scaled(draft_ms / 1000) if draft else costs


@dataclass
class Ledger:
    """What a simulated model's device calls cost: simulated seconds, and this process's own
    wall time inside them (to be taken off a wall-clock measurement)."""

    device_seconds: float = 0.0
    inside_seconds: float = 0.0  # decodes and rewinds
    decode_inside_seconds: float = 0.0  # of which decodes
    decodes: int = 0
    rows_out: int = 0  # rows copied to the host
    graphless: int = 0  # decodes of another shape than the last one's: run without a graph
    captures: int = 0  # decodes that captured a graph (the second of a shape in a row)

    def since(self, earlier: Ledger) -> Ledger:
        return Ledger(**{f.name: getattr(self, f.name) - getattr(earlier, f.name) for f in fields(self)})

    def snapshot(self) -> Ledger:
        return replace(self)

    @property
    def shape_changes(self) -> int:
        return self.graphless


@dataclass(frozen=True)
class Script:
    """The text the target writes, and where a draft model agrees with it.

    tokens[:prompt_length] is the prompt. At position p the target's token is tokens[p]; a
    draft's is tokens[p] where draft_agrees[p], else wrong[p] (never tokens[p])."""

    tokens: tuple[int, ...]
    prompt_length: int
    n_vocab: int
    draft_agrees: tuple[bool, ...]
    wrong: tuple[int, ...]

    @property
    def prompt(self) -> list[int]:
        return list(self.tokens[: self.prompt_length])

    @property
    def answer(self) -> list[int]:
        return list(self.tokens[self.prompt_length :])


def make_script(n_vocab: int = DEFAULT_VOCAB, prompt_tokens: int = 256, answer_tokens: int = 320, *,
                seed: int = 0, copy_share: float = 0.5, agreement: float = 0.95) -> Script:
    """A seeded script: segments of fresh random tokens (4-24 long) and, with chance
    `copy_share` each, spans (8-48 long) copied from anywhere earlier; a draft that agrees at
    each position with chance `agreement`."""
    rng = np.random.default_rng(seed)
    length = prompt_tokens + answer_tokens
    tokens: list[int] = list(rng.integers(FIRST_TOKEN, n_vocab - 1, size=16))
    while len(tokens) < length:
        if rng.random() < copy_share:
            span = int(rng.integers(8, 49))
            start = int(rng.integers(0, max(1, len(tokens) - span)))
            tokens.extend(tokens[start : start + span])
        else:
            tokens.extend(int(t) for t in rng.integers(FIRST_TOKEN, n_vocab - 1, size=int(rng.integers(4, 25))))
    tokens = [int(t) for t in tokens[:length]]
    agrees = rng.random(length) < agreement
    shift = rng.integers(1, n_vocab - 1 - FIRST_TOKEN, size=length)
    wrong = [FIRST_TOKEN + (t - FIRST_TOKEN + int(s)) % (n_vocab - 1 - FIRST_TOKEN) for t, s in zip(tokens, shift)]
    return Script(tuple(tokens), prompt_tokens, n_vocab, tuple(bool(a) for a in agrees), tuple(wrong))


@functools.lru_cache(maxsize=4)
def _base_row(n_vocab: int) -> np.ndarray:
    """Every row's entries but its chosen one: seeded, in [0, 1), read-only."""
    row = np.random.default_rng(n_vocab).random(n_vocab, dtype=np.float32)
    row.flags.writeable = False
    return row


@dataclass
class _OutputBuffer:
    """llama.cpp's output buffer: rows of n_vocab float32s, reused, grown when a decode needs
    more rows. Row r holds the base row with HIGH_LOGIT at marked[r]."""

    n_vocab: int
    rows: np.ndarray = field(init=False)
    marked: list[int] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        self.rows = np.empty((0, self.n_vocab), dtype=np.float32)

    def write(self, r: int, token: int) -> None:
        if r >= self.rows.shape[0]:
            self._grow(r + 1)
        previous = self.marked[r]
        if previous != token:
            self.rows[r, previous] = _base_row(self.n_vocab)[previous]
            self.rows[r, token] = HIGH_LOGIT
            self.marked[r] = token

    def _grow(self, rows: int) -> None:
        size = max(rows, 2 * self.rows.shape[0])
        grown = np.empty((size, self.n_vocab), dtype=np.float32)
        grown[: self.rows.shape[0]] = self.rows
        grown[self.rows.shape[0] :] = _base_row(self.n_vocab)
        self.marked.extend([0] * (size - self.rows.shape[0]))  # (entry 0 holds its base value: no id is 0)
        self.rows = grown


class SimulatedModel:
    """A model on the simulated device: what specli.llama.backend.Model offers the engine, the
    proposers, DraftModel and Session, with one sequence. `draft`: it writes the script's draft
    tokens (Script.draft_agrees) instead of the target's."""

    recurrent = False  # an attention-only cache: any rewind
    max_rewind = None
    rewind_problem = None

    def __init__(self, script: Script, costs: DeviceCosts, *, draft: bool = False, n_ctx: int = 4096,
                 batch_size: int = 64, path: Path | str | None = None) -> None:
        self.script = script
        self.costs = costs
        self.draft = draft
        self.path = Path(path or ("sim-draft.gguf" if draft else "sim-target.gguf"))
        self.n_vocab = script.n_vocab
        self.n_ctx = self.n_ctx_train = n_ctx
        self.batch_size = batch_size
        self.sequences = 1  # one sequence, as backend.Model loads by default
        self.n_past = 0
        self.bos, self.add_bos, self.add_eos = 0, True, False
        self.ledger = Ledger()
        self.closed = False
        self.on_gpu = True  # every layer and the output head on the (simulated) GPU
        self._kv: list[int] = []
        self._on_script = 0  # the KV cache's first positions that hold the script's tokens
        self._buffer = _OutputBuffer(self.n_vocab)
        self._batch_tokens = np.zeros(batch_size, dtype=np.int32)  # backend.Model's batch arrays
        self._batch_pos = np.zeros(batch_size, dtype=np.int32)
        self._batch_logits = np.zeros(batch_size, dtype=np.int8)
        self._shape: tuple[int, int, str] | None = None
        self._captured = False  # whether the graph of the last shape is captured
        self._pieces: dict[int, bytes] = {}
        self._chosen: list[int] = []  # the last decode_argmax's choices
        self._decode_seconds = [0.0] + [costs.decode(n) for n in range(1, batch_size + 1)]
        self._row_seconds = costs.copy(1, self.n_vocab)

    # --- decode, as backend.Model -------------------------------------------------

    def decode(self, tokens: list[int], *, all_logits: bool = False,
               outputs: Sequence[bool] | None = None) -> np.ndarray:
        if outputs is not None:
            rows = self._decode(tokens, True, outputs)
        else:
            rows = self._decode(tokens, all_logits)
        return self._buffer.rows[:rows]

    def decode_greedy(self, tokens: list[int]) -> int:
        """The last row's argmax, chosen on the device by a greedy sampler."""
        self._decode(tokens, False, sampler="greedy")
        return self._chosen[-1]

    def decode_argmax(self, tokens: list[int], *, all_rows: bool = False) -> list[int]:
        """Each row's argmax, chosen on the device: no row crosses to the host."""
        self._decode(tokens, all_rows, sampler="candidates")
        return list(self._chosen)

    def _decode(self, tokens: list[int], all_rows: bool, outputs: Sequence[bool] | None = None, *,
                sampler: str = "") -> int:
        """backend.Model._decode's work in Python (the batch's arrays, chunk by chunk), each
        chunk decoded on the device. Returns the rows written."""
        if not tokens:
            raise ValueError("decode needs at least one token")
        if self.n_past + len(tokens) > self.n_ctx:
            raise ValueError(f"the context is full ({self.n_ctx} tokens)")
        if all_rows and len(tokens) > self.batch_size:
            raise ValueError("all_logits decode is limited to one batch")
        start, rows = 0, 0
        while start < len(tokens):
            chunk = tokens[start : start + self.batch_size]
            n = len(chunk)
            self._batch_tokens[:n] = chunk
            self._batch_pos[:n] = np.arange(self.n_past, self.n_past + n)
            if outputs is not None:
                self._batch_logits[:n] = np.asarray(outputs[start : start + n], dtype=bool)
            else:
                self._batch_logits[:n] = 1 if all_rows else 0
            if start + n == len(tokens):
                self._batch_logits[n - 1] = 1
            rows = self._device_decode(chunk, sampler)
            start += n
        return rows

    def _device_decode(self, chunk: list[int], sampler: str) -> int:
        """What llama_decode does, simulated: the KV cache takes the chunk, the rows the batch
        flags are written (or, with a device sampler, chosen), and the device's time is priced."""
        started = time.perf_counter()
        out = self._batch_logits[: len(chunk)].nonzero()[0].tolist()
        first = self.n_past
        for i, token in enumerate(chunk):
            if self._on_script == first + i and first + i < len(self.script.tokens) \
                    and self.script.tokens[first + i] == token:
                self._on_script += 1
        self._kv.extend(chunk)
        self.n_past += len(chunk)
        choices = [self._next(first + i) for i in out]
        if sampler:
            self._chosen = choices
        else:
            for r, token in enumerate(choices):
                self._buffer.write(r, token)
        self._price(len(chunk), len(out), sampler)
        spent = time.perf_counter() - started
        self.ledger.inside_seconds += spent
        self.ledger.decode_inside_seconds += spent
        return len(out)

    def _next(self, p: int) -> int:
        """The token this model writes after positions [0, p]: the script's while the cache
        holds the script, else one derived from the token at p and its position."""
        script, q = self.script, p + 1
        if self._on_script > p and q < len(script.tokens):
            return script.tokens[q] if not self.draft or script.draft_agrees[q] else script.wrong[q]
        return FIRST_TOKEN + (self._kv[p] * 40503 + q * 9176 + 7 * self.draft) % (self.n_vocab - 1 - FIRST_TOKEN)

    def _price(self, tokens: int, rows: int, sampler: str) -> None:
        costs, ledger = self.costs, self.ledger
        on_device = {"candidates": costs.sampler, "greedy": costs.greedy}
        seconds = self._decode_seconds[tokens] + (on_device[sampler] if sampler else rows * self._row_seconds)
        shape = (tokens, rows, sampler)
        if shape != self._shape:  # ggml-cuda: properties changed, run without the graph
            ledger.graphless += 1
            seconds += costs.graphless
            self._captured = False
            self._shape = shape
        elif not self._captured:  # the same shape twice in a row: captured now
            ledger.captures += 1
            seconds += costs.capture
            self._captured = True
        ledger.device_seconds += seconds
        ledger.decodes += 1
        ledger.rows_out += 0 if sampler else rows

    def rewind(self, n_keep: int) -> None:
        started = time.perf_counter()
        n_keep = max(n_keep, 0)
        del self._kv[n_keep:]
        self._on_script = min(self._on_script, n_keep)
        self.n_past = min(self.n_past, n_keep)
        self.ledger.inside_seconds += time.perf_counter() - started

    # --- vocabulary -------------------------------------------------------------

    @property
    def eos(self) -> int:
        return self.n_vocab - 1

    def is_end_of_generation(self, token: int) -> bool:
        return token == self.n_vocab - 1

    def end_of_generation_tokens(self) -> list[int]:
        return [self.n_vocab - 1]

    def piece(self, token: int, special: bool = False) -> bytes:
        """' t<id>' (special tokens: nothing unless `special`), cached as backend.Model caches."""
        cached = self._pieces.get(token)
        if cached is None:
            cached = self._pieces[token] = b" t%d" % token
        if token in (self.bos, self.eos) and not special:
            return b""
        return cached

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """piece's inverse: 't<id>' words are their ids, any other word a token derived from it."""
        ids = [self.bos] if add_special and self.add_bos else []
        for word in text.split():
            number = word[1:]
            if word.startswith("t") and number.isdigit() and int(number) < self.n_vocab:
                ids.append(int(number))
            else:
                ids.append(FIRST_TOKEN + sum(word.encode()) % (self.n_vocab - 1 - FIRST_TOKEN))
        return ids

    # --- lifetime -----------------------------------------------------------------

    def close(self) -> None:
        self.closed = True

    def __enter__(self) -> SimulatedModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
