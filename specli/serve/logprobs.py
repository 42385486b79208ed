"""Written tokens' logprobs (decode/logprobs.py) in OpenAI's two forms: a chat's `content`
list, and a completion's parallel lists with each token's offset in the text. A token's text
is its piece with special tokens written out; `bytes` keeps what a piece holds of a character."""

from __future__ import annotations

from typing import Callable, Sequence

from specli.decode.logprobs import TokenLogprob
from specli.serve.responses import ChatLogprobs, ChatTokenLogprob, TextLogprobs, TopLogprob

Scored = Sequence[tuple[int, TokenLogprob]]  # (token id, its logprob)


class LogprobWriter:
    """One answer's logprobs, whole or a run of tokens at a time (streamed): `piece` gives a
    token's bytes; `offset`, where the answer's text starts (a completion: after its prompt)."""

    def __init__(self, piece: Callable[[int], bytes], offset: int = 0) -> None:
        self._piece, self.offset = piece, offset

    def _text(self, token: int) -> tuple[str, list[int]]:
        data = self._piece(token)
        return data.decode("utf-8", "replace"), list(data)

    def _top(self, token: int, logprob: float) -> TopLogprob:
        text, data = self._text(token)
        return TopLogprob(token=text, logprob=logprob, bytes=data)

    def chat(self, scored: Scored) -> ChatLogprobs:
        content = []
        for token, score in scored:
            text, data = self._text(token)
            content.append(ChatTokenLogprob(token=text, logprob=score.logprob, bytes=data,
                                            top_logprobs=[self._top(i, lp) for i, lp in score.top]))
        return ChatLogprobs(content=content)

    def text(self, scored: Scored) -> TextLogprobs:
        """The completions form; the offsets go on from the last run's."""
        tokens, offsets = [], []
        for token, _ in scored:
            tokens.append(self._text(token)[0])
            offsets.append(self.offset)
            self.offset += len(tokens[-1])
        return TextLogprobs(tokens=tokens, token_logprobs=[score.logprob for _, score in scored],
                            top_logprobs=[{self._text(i)[0]: lp for i, lp in score.top} for _, score in scored],
                            text_offset=offsets)
