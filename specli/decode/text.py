"""Committed token bytes to released text: UTF-8 that spans tokens, and stop strings."""

from __future__ import annotations

import codecs


class TextStream:
    """Releases text as tokens are committed.

    A character split across tokens is released once complete. Text that could still
    turn into a stop string is held back until it cannot; a completed stop string ends
    the stream, and neither it nor anything after it is released.
    """

    def __init__(self, stop: list[str] | tuple[str, ...] = ()) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._stop = [s for s in stop if s]
        self._held = ""
        self.stopped = False

    def push(self, piece: bytes) -> str:
        """Add one token's bytes; return the text that is now final."""
        if self.stopped:
            return ""
        text = self._held + self._decoder.decode(piece)
        if not self._stop:
            self._held = ""
            return text
        hit = min((i for i in (text.find(s) for s in self._stop) if i >= 0), default=-1)
        if hit >= 0:
            self.stopped = True
            self._held = ""
            return text[:hit]
        keep = self._longest_stop_prefix_suffix(text)
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def flush(self) -> str:
        """End of generation: release whatever was held back."""
        if self.stopped:
            return ""
        text = self._held + self._decoder.decode(b"", final=True)
        self._held = ""
        return text

    def _longest_stop_prefix_suffix(self, text: str) -> int:
        """Length of the longest end of `text` that some stop string starts with."""
        best = 0
        for stop in self._stop:
            for size in range(min(len(stop) - 1, len(text)), best, -1):
                if text.endswith(stop[:size]):
                    best = size
                    break
        return best


def common_prefix_length(a: list[int], b: list[int]) -> int:
    """How many leading tokens two sequences share (a binary search over list slices)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    low, high = 0, n  # a[:low] == b[:low] holds; a[:high] == b[:high] does not
    while high - low > 1:
        mid = (low + high) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid
    return low
