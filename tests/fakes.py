"""A toy language model with scripted logits, speaking the backend.Model interface.

Its logits are a pure function of the last `order` tokens of the context, so "plain
decoding" has one right answer and any KV-cache bookkeeping error shows up as a
different token. A draft is the same model with noise added to the logits.
"""

from __future__ import annotations

import functools
import zlib

import numpy as np


class FakeModel:
    def __init__(
        self,
        n_vocab: int = 12,
        *,
        seed: int = 0,
        order: int = 2,
        sharpness: float = 2.0,
        noise_seed: int | None = None,
        noise: float = 0.0,
        eog: int | None = None,
        n_ctx: int = 1024,
    ) -> None:
        self.n_vocab = n_vocab
        self.seed = seed
        self.order = order
        self.sharpness = sharpness
        self.noise_seed = noise_seed
        self.noise = noise
        self.eog = eog
        self.n_ctx = n_ctx
        self.kv: list[int] = []
        self.batch_sizes: list[int] = []
        self.argmax_decodes = 0  # decodes through decode_argmax
        self.closed = False
        self.on_gpu = False  # a CPU: no shapes to keep, rows come to the host

    @property
    def n_past(self) -> int:
        return len(self.kv)

    def logits_after(self, context: list[int]) -> np.ndarray:
        key = np.array([self.seed, *context[-self.order :]], dtype=np.int64).tobytes()
        return _scripted_logits(key, self.n_vocab, self.sharpness, self.noise_seed, self.noise)

    def decode(self, tokens: list[int], *, all_logits: bool = False) -> np.ndarray:
        assert tokens, "decode needs tokens"
        assert self.n_past + len(tokens) <= self.n_ctx, "context overflow"
        self.batch_sizes.append(len(tokens))
        rows = []
        for token in tokens:
            self.kv.append(token)
            rows.append(self.logits_after(self.kv))
        return np.array(rows if all_logits else rows[-1:])

    def decode_argmax(self, tokens: list[int], *, all_rows: bool = False) -> list[int]:
        """backend.Model's device path: each row's argmax instead of the row."""
        self.argmax_decodes += 1
        return [int(np.argmax(row)) for row in self.decode(tokens, all_logits=all_rows)]

    def rewind(self, n_keep: int) -> None:
        del self.kv[n_keep:]

    def piece(self, token: int) -> bytes:
        return chr(ord("a") + token).encode()

    def is_end_of_generation(self, token: int) -> bool:
        return token == self.eog

    def close(self) -> None:
        self.closed = True


@functools.lru_cache(maxsize=1 << 16)
def _scripted_logits(key: bytes, n_vocab: int, sharpness: float, noise_seed: int | None, noise: float) -> np.ndarray:
    """FakeModel's logits for one context key. A pure function, so it is computed once per
    key (seeding a generator is most of its cost) and returned read-only."""
    rng = np.random.default_rng(zlib.crc32(key))
    logits = rng.normal(size=n_vocab) * sharpness
    if noise and noise_seed is not None:
        noise_rng = np.random.default_rng(zlib.crc32(key) ^ (noise_seed * 7919))
        logits = logits + noise_rng.normal(size=n_vocab) * noise
    logits = logits.astype(np.float32)
    logits.flags.writeable = False
    return logits


def plain_greedy(model: FakeModel, prompt: list[int], max_tokens: int) -> list[int]:
    """Reference: one token at a time, no speculation, no KV cache games."""
    context = list(prompt)
    out: list[int] = []
    while len(out) < max_tokens:
        token = int(np.argmax(model.logits_after(context)))
        context.append(token)
        if model.is_end_of_generation(token):
            break
        out.append(token)
    return out
