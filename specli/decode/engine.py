"""The speculative loop. A generator of small events; it never prints. Each step proposes
(decode/batch.py builds its verify batch), decodes the batch on the target, verifies
(decode/verify.py: the target's own choices) and accepts and rewinds here.

The prompt (what the cache does not already hold of it) is decoded in one batch and its
last row writes the first token, as in llama.cpp's own tools, so plain and speculative runs
start from the same token; the same prompt again reuses that row. Then
each step: the proposer drafts up to K tokens; the target decodes [last] + draft in one
batch with logits at every position; verification keeps the longest valid prefix and
the target writes the next token itself (the correction, or a bonus token when every
draft token was kept); rejected positions are removed from the target's KV cache.
With no draft the step is exactly one plain decode, so `--draft none` runs this same loop.

Under a constraint (a JSON schema, a grammar) every choice of the target is made from its
row masked by the constraint's state before that position. Where the constraint forces
tokens they are drafted first ("grammar") and need no verification: their rows ask
llama.cpp for no logits (unless the request asks for logprobs, which come from each written
token's raw row: decode/logprobs.py). A draft token the constraint forbids ends the draft before it is
verified. So the output is what plain decoding under the same constraint writes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator, Protocol, Sequence

import numpy as np

from specli.decode.batch import Batcher, VerifyBatch
from specli.decode.constraint import Matcher
from specli.decode.events import Event, Finished, Source, Stats, StepRecord, Token
from specli.decode.exact import BatchCap
from specli.decode.logprobs import TokenLogprob, token_logprob
from specli.decode.media import PromptMedia, text_only
from specli.decode.policy import MAX_DRAFT, DraftPolicy
from specli.decode.proposers import NoProposer, Proposer
from specli.decode.request import GenerationRequest
from specli.decode.shapes import BatchShapes
from specli.decode.text import TextStream, common_prefix_length
from specli.decode.verify import Verifier
from specli.errors import PromptError


class TargetModel(Protocol):
    """What the engine needs from the target (backend.Model, or a fake in tests)."""

    n_ctx: int
    n_past: int

    def decode(self, tokens: list[int], *, all_logits: bool = False,
               outputs: Sequence[bool] | None = None) -> np.ndarray: ...
    def decode_argmax(self, tokens: list[int], *, all_rows: bool = False) -> Sequence[int]:
        """As decode, but each row's argmax (ties: the first best), chosen where the logits
        are; only with GenerationOptions.verify_on_device."""
        ...

    def rewind(self, n_keep: int) -> None: ...
    def piece(self, token: int) -> bytes: ...
    def is_end_of_generation(self, token: int) -> bool: ...



@dataclass
class TargetCache:
    """What the target's KV cache holds, kept across generations on one loaded target (a
    chat's turns, a server's requests): its tokens, and the last prompt with its last row's
    logits (or, verified on the device, its argmax), which the same prompt again reuses."""

    tokens: list[int] = field(default_factory=list)
    prompt: list[int] | None = None
    prompt_on_device: bool = False
    prompt_row: object = None
    # The verify batch sizes its decodes keep to (a GPU's reusable shapes: the session prices
    # them), and the size of the last: the graph the target replays, whichever engine decodes.
    shapes: BatchShapes = field(default_factory=BatchShapes.any)


@dataclass(frozen=True)
class EngineOptions:
    """How an engine verifies, beside its request: `verify_on_device`: greedy runs without a
    repetition penalty have llama.cpp take each verified row's argmax on the device that
    computed the logits, and the host reads a few candidates per row instead of a vocabulary
    row (the same tokens); `cap`: the most rows one verify decodes ([last], forced, drafted
    and padding), by the position of its first row (--exact: the sizes measured exact there;
    None: MAX_DRAFT and [last]), held where something drafts to `reach` and [last];
    `draft_model`: the draft model's name, where one drafts (the stats name it)."""

    verify_on_device: bool = False
    cap: BatchCap | None = None
    draft_model: str = ""
    reach: int | None = None  # a recurrent target's snapshots: the most positions a step takes back cheaply


class ContextLengthError(PromptError):
    """A prompt that leaves no room for a generated token in the context."""

    def __init__(self, n_tokens: int, n_ctx: int) -> None:
        super().__init__(f"the prompt is {n_tokens} tokens but the context holds {n_ctx}",
                         "raise --ctx-size or shorten the prompt")


def check_prompt_fits(n_tokens: int, n_ctx: int) -> None:
    """The prompt and at least one generated token must fit in the context."""
    if n_tokens >= n_ctx:
        raise ContextLengthError(n_tokens, n_ctx)


class Engine:
    """Runs the generations of one request on the target (run the same request on several
    prompts: a chat's turns). `stats` stays readable if the consumer stops early (Ctrl-C).

    `cache` is what the target's KV cache holds, kept by whoever keeps the target loaded
    (the session); `matcher`: the request's constraint, followed afresh in each generation."""

    def __init__(self, target: TargetModel, proposer: Proposer, policy: DraftPolicy, request: GenerationRequest,
                 *, cache: TargetCache | None = None, matcher: Matcher | None = None,
                 options: EngineOptions = EngineOptions()) -> None:
        self.target = target
        self.draft_model = options.draft_model
        self.proposer = proposer
        self.policy = policy
        self.request = request.seeded()
        # Sampling: the token at each position is keyed by (seed, position).
        self.seed: int = self.request.seed  # type: ignore[assignment]
        self.sampling = request.sampling
        self.cache = cache if cache is not None else TargetCache()
        self.matcher = matcher
        # The most rows a verify decodes, by where it starts: --exact's measured sizes, else the
        # longest draft and [last]; where something drafts, no more than a recurrent target's
        # snapshots take back (a rejected draft and padding rows).
        cap = options.cap if options.cap is not None else BatchCap.anywhere(MAX_DRAFT + 1)
        drafts = not isinstance(proposer, NoProposer)
        cap = cap.within(options.reach + 1) if options.reach is not None and drafts else cap
        self.shapes = self.cache.shapes  # shared with the policy that prices them
        # Forced tokens are drafted only where something drafts (--draft none: one token a step).
        self.batcher = Batcher(target, proposer, policy, cap, self.shapes, matcher,
                               forces=matcher is not None and drafts)
        # A penalised or masked row depends on the tokens before it, which the device does not
        # see; logprobs need the rows themselves.
        self._on_device = (options.verify_on_device and self.sampling.pure_greedy and matcher is None
                           and self.request.logprobs is None)
        self.verifier = Verifier(self.sampling, self.seed, matcher, target.is_end_of_generation,
                                 on_device=self._on_device)
        self.stats = self._fresh_stats()
        self._step_ended: float | None = None  # when the previous step's logits were read

    def generate(self, prompt: list[int], media: PromptMedia | None = None) -> Iterator[Event]:
        """Token events as text is committed, a StepRecord after each step's tokens, then
        Finished. The prompt is checked against the context now, before any event. `media`:
        the prompt's images, whose positions hold placeholders in `prompt` (decode/media.py)."""
        if not prompt:
            raise ValueError("generate needs at least one prompt token")
        check_prompt_fits(len(prompt) if media is None else max(len(prompt), media.cells), self.target.n_ctx)
        self.stats = self._fresh_stats()
        if self.matcher is not None:
            self.matcher.reset()
        return self._generate(prompt, media)

    def _prefill(self, prompt: list[int], media: PromptMedia | None) -> tuple[int | None, TokenLogprob | None]:
        """Bring the target's cache to the prompt and choose the first token from its last row
        (None: a request for no tokens), with its logprob where the request asks for them.

        What the cache already holds of the prompt (an earlier turn of a chat) stays; the
        prompt's last token is decoded again for its logits row, unless the same prompt came
        last time: then its row is the one kept from then (a one-row decode rounds otherwise,
        and a near-tie could flip: the same request sent again writes the same text). A caller
        that wants the whole prompt decoded, as a fresh run decodes it, clears the cache
        first (Session.clear_cache: a served exact request, bench). The rest of the prompt goes in
        one decode, as in llama.cpp's own tools: its last row writes the first token, so plain
        and speculative runs share it exactly."""
        target, cache, request = self.target, self.cache, self.request
        # (What the target holds past n_past is gone: a calibration, or another engine, rewound it.)
        cached = min(common_prefix_length(cache.tokens, prompt), target.n_past)
        again = (request.max_tokens > 0 and cached == len(prompt) and cache.prompt == prompt
                 and cache.prompt_on_device == self._on_device)
        keep = len(prompt) if again else min(cached, len(prompt) - 1)
        if media is not None:
            keep = media.start_of(keep)  # an image is decoded whole
        target.rewind(keep)
        if target.n_past < keep:  # a recurrent target's state went back further (an image there, no checkpoint)
            keep, again = target.n_past, False
        self.stats.prompt_cached = keep
        cache.tokens = []
        if request.max_tokens <= 0:
            cache.prompt, cache.prompt_row = None, None
            return None, None
        if again:
            row = cache.prompt_row
        elif media is not None:
            row = np.array(media.decode(target, prompt, keep))
            row = int(np.argmax(row)) if self._on_device else row  # (the device's argmax is the host's)
        elif self._on_device:
            row = int(target.decode_argmax(prompt[keep:])[0])
        else:
            row = np.array(target.decode(prompt[keep:])[0])  # a copy: kept for the same prompt again
        cache.prompt, cache.prompt_on_device, cache.prompt_row = list(prompt), self._on_device, row
        if self._on_device:
            return row, None  # type: ignore[return-value]
        token = self.verifier.write(self.sampling.penalise(row, prompt), len(prompt))  # type: ignore[arg-type]
        return token, self._score(row, token)  # type: ignore[arg-type]

    def _score(self, row: np.ndarray, token: int) -> TokenLogprob | None:
        """The written token's logprob from its raw row, where the request asks for them."""
        if self.request.logprobs is None:
            return None
        return token_logprob(row, token, self.request.logprobs)

    def _fresh_stats(self) -> Stats:
        return Stats(proposer=self.proposer.name, translated=self.proposer.translated, draft_model=self.draft_model)

    def _generate(self, prompt: list[int], media: PromptMedia | None) -> Iterator[Event]:
        target, stats = self.target, self.stats
        stats.prompt_tokens = len(prompt)
        started = time.perf_counter()
        self._step_ended = None
        encoded = media.encode_seconds if media is not None else 0.0
        first, score = self._prefill(prompt, media)
        # What proposers read: the text, images left out (the same list where there are none).
        tokens = list(prompt)  # the committed sequence: prompt + output
        seen = tokens if media is None else text_only(prompt)
        self.proposer.prepare(seen)
        if media is not None:
            stats.images = media.count
            stats.encode_seconds = media.encode_seconds - encoded
        stats.prefill_seconds = time.perf_counter() - started - stats.encode_seconds
        # KV cells the prompt takes beyond its positions (an M-RoPE image's embeddings).
        extra = max(0, media.cells - len(prompt)) if media is not None else 0

        text = TextStream(self.request.stop)
        started = time.perf_counter()
        reason = "length"
        step: StepRecord | None = None
        try:
            committed: list[int] = [] if first is None else [first]
            sources: list[Source] = ["target"] * len(committed)
            scores: list[TokenLogprob | None] = [score] * len(committed)
            stats.first_token_from_prefill = bool(committed)
            while committed:
                # Emit what the last step committed; committed[-1] is not in the KV cache yet.
                reason = ""
                forced = step.forced if step else 0
                for i, (token, source, score) in enumerate(zip(committed, sources, scores)):
                    tokens.append(token)
                    if seen is not tokens:
                        seen.append(token)
                    if target.is_end_of_generation(token):
                        reason = "eog"
                        break
                    stats.tokens += 1
                    released = text.push(target.piece(token))
                    proposer = ("grammar" if i < forced else step.proposer) if source == "draft" and step else ""
                    yield Token(token, released, source, proposer, score)
                    if text.stopped:
                        reason = "stop"
                        break
                if step is not None:
                    yield step
                if not reason and self.matcher is not None and self.matcher.stopped:
                    reason = "eog"  # the structure is complete: only the end of generation may follow
                if reason:
                    break
                remaining = self.request.max_tokens - stats.tokens
                room = target.n_ctx - target.n_past - 1 - extra  # positions left after committed[-1]
                if remaining <= 0 or room < 0:
                    reason = "length" if remaining <= 0 else "context"
                    break
                committed, sources, scores, step = self._step(tokens, seen, committed[-1], min(remaining - 1, room))
            tail = text.flush()
            if tail:
                yield Token(-1, tail, "target")  # held-back text with no token of its own
        finally:
            stats.seconds = time.perf_counter() - started
            # What plain decoding holds: the committed tokens but the last (a verify batch may
            # hold more), so plain and drafted runs keep one prefix for the next prompt and
            # split a conversation at the same points.
            self.cache.tokens = tokens[: min(target.n_past, len(tokens) - 1)]
        stats.finish_reason = reason
        yield Finished(reason, stats)

    def _step(self, tokens: list[int], seen: list[int], last: int,
              room: int) -> tuple[list[int], list[Source], list[TokenLogprob | None], StepRecord]:
        """Propose (from `seen`, the text of `tokens`), verify, accept, rewind: one target
        decode. Returns the committed tokens, who wrote each, and their logprobs (None each,
        where the request asks for none)."""
        target = self.target
        t0 = time.perf_counter()
        batch = self.batcher.next(seen, last, room)
        forced, draft, padding, proposal = batch.forced, batch.draft, batch.padding, batch.proposal
        t1 = time.perf_counter()
        rows = self._decode(batch)
        size = len(forced) + len(draft) + 1 + padding
        self.shapes.used(size, size - padding)
        t2 = time.perf_counter()
        forced_rows = []
        if forced and self.request.logprobs is not None:  # every row has logits: the forced tokens' first
            forced_rows, rows = rows[: len(forced)], rows[len(forced) :]
        accepted, written = self.verifier.verify(rows, tokens + forced, draft, self.stats.prompt_tokens)
        t3 = time.perf_counter()
        committed = forced + draft[:accepted] + [written]
        scores = [self._score(row, token) for row, token in zip([*forced_rows, *rows[: accepted + 1]], committed)] \
            if self.request.logprobs is not None else [None] * len(committed)
        # Keep `last`, the forced and the accepted draft tokens; the written token is the new `last`.
        if accepted < len(draft) or padding:
            keep = target.n_past - (len(draft) - accepted) - padding
            target.rewind(keep)
            # (a recurrent target's snapshots reach this far: its `reach` caps every verify)
            assert target.n_past == keep, f"the target's cache stands at {target.n_past}, not {keep}"
        loop = 0.0 if self._step_ended is None else max(0.0, t0 - self._step_ended)
        self._step_ended = t3
        step = StepRecord(len(draft), accepted, t1 - t0, t2 - t1, t3 - t2, loop, proposal.key, proposal.extent,
                          proposal.proposer if draft else "", proposal.support[: len(draft)],
                          proposal.agreeing[: len(draft)], batch.asked,
                          # (the costs price batches whose every row has logits)
                          0.0 if forced else self.policy.price(size - 1), forced=len(forced),
                          rows=size,
                          draft_decode_seconds=proposal.decode_seconds)
        self.stats.record(step)
        self.policy.record(step)
        sources: list[Source] = ["draft"] * (len(forced) + accepted) + ["target"]
        return committed, sources, scores, step

    def _decode(self, batch: VerifyBatch) -> Sequence:
        """The target's rows for the batch: the device's argmax of each, or logits (none for
        the forced tokens' rows where no logprobs are asked for: nothing reads them)."""
        tokens, forced = batch.tokens, len(batch.forced)
        if self._on_device:
            return self.target.decode_argmax(tokens, all_rows=True)
        if forced and self.request.logprobs is None:
            return self.target.decode(tokens, outputs=[False] * forced + [True] * (len(tokens) - forced))
        return self.target.decode(tokens, all_logits=True)
