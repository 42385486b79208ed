"""Images in a prompt, as the engine sees them: positions that are not tokens.

A prompt with images is a token list in which every position an image takes holds a
placeholder: a negative id, the same for every position of one image and different for
different images (read from the image's bytes), so a cache that holds the same images at the
same places matches as a prefix, and one that holds other images does not. The target's
positions and the list's indices stay one and the same, whatever an image costs in KV cells
(an M-RoPE image takes fewer positions than embeddings).

Invariants:
- Nothing but the prompt holds placeholders: every token a model writes is >= 0.
- Proposers see the text alone (`text_only`): lookup never matches or proposes an image
  position, and a draft model without vision drafts from the prompt with its images left out.
- A decode never starts inside an image (`PromptMedia.start_of`): an image is decoded whole.
"""

from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np


def text_only(tokens: Sequence[int]) -> list[int]:
    """The tokens with every image position left out: what proposers read."""
    return [token for token in tokens if token >= 0]


class PromptMedia(Protocol):
    """The images of one prompt, decoded into the target with its text (specli.llama.vision)."""

    cells: int  # the KV cells the whole prompt takes (an image's embeddings, its text's tokens)
    count: int  # its images
    encode_seconds: float  # the images' encoding so far (apart from the decode of their embeddings)

    def start_of(self, position: int) -> int:
        """Where a decode that is to reach `position` must start: the first position of the
        image that holds it, else `position` itself."""
        ...

    def decode(self, target: object, prompt: list[int], start: int) -> np.ndarray:
        """Decode prompt[start:] (its text and its images) into the target, whose cache holds
        prompt[:start]; the logits row of the prompt's last position (a text token's)."""
        ...
