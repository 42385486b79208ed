"""The vocabulary rule: may this draft propose tokens for this target?

The rule of llama.cpp's common/speculative.cpp (common_speculative_are_compatible), applied
before a draft model is paired with a target; a refusal names the rule that failed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specli.errors import VocabMismatchError

if TYPE_CHECKING:
    from specli.llama.backend import Model

VOCAB_TYPES = {0: "none", 1: "SPM", 2: "BPE", 3: "WPM", 4: "UGM", 5: "RWKV", 6: "PLaMo-2"}
VOCAB_MAX_SIZE_DIFFERENCE = 128
VOCAB_CHECK_START_TOKEN_ID = 5


def check_vocab_compatible(target: Model, draft: Model) -> None:
    """Refuse a draft whose tokens would not mean the same thing to the target.

    The rule of llama.cpp's common/speculative.cpp (common_speculative_are_compatible), in its
    order: the same vocabulary type; the same add_bos flag and, when BOS is added, the same BOS
    id; the same add_eos flag and, when EOS is added, the same EOS id; sizes at most 128 tokens
    apart; and the same text for every token from id 5 up to the smaller size. A BOS or EOS the
    tokenizer does not add is not compared (Gemma 3 GGUFs end turns with different EOS ids).
    """
    names = f"draft {draft.path.name} and target {target.path.name}"
    hint = "pick a draft from the same model family"
    if target.vocab_type != draft.vocab_type:
        raise VocabMismatchError(
            f"{names} use different tokenizers "
            f"({VOCAB_TYPES.get(draft.vocab_type, draft.vocab_type)} vs {VOCAB_TYPES.get(target.vocab_type, target.vocab_type)})",
            hint,
        )
    if target.add_bos != draft.add_bos or (target.add_bos and target.bos != draft.bos):
        raise VocabMismatchError(
            f"{names} disagree on the BOS token (draft {draft.bos}, add={draft.add_bos}; "
            f"target {target.bos}, add={target.add_bos})",
            hint,
        )
    if target.add_eos != draft.add_eos or (target.add_eos and target.eos != draft.eos):
        raise VocabMismatchError(
            f"{names} disagree on the EOS token (draft {draft.eos}, add={draft.add_eos}; "
            f"target {target.eos}, add={target.add_eos})",
            hint,
        )
    if abs(target.n_vocab - draft.n_vocab) > VOCAB_MAX_SIZE_DIFFERENCE:
        raise VocabMismatchError(
            f"{names} have vocabularies of {draft.n_vocab} and {target.n_vocab} tokens "
            f"(more than {VOCAB_MAX_SIZE_DIFFERENCE} apart)",
            hint,
        )
    if target.path.resolve() == draft.path.resolve():
        return  # the same file: identical by construction
    for token in range(VOCAB_CHECK_START_TOKEN_ID, min(target.n_vocab, draft.n_vocab)):
        if target.token_text(token) != draft.token_text(token):
            raise VocabMismatchError(
                f"{names} differ at token id {token} "
                f"(draft {draft.token_text(token)!r}, target {target.token_text(token)!r})",
                hint,
            )
