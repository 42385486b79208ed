"""Which model files a command runs: -m PAIR through the registry, --target/--draft as files
or Hub references, or the embedded model."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

from specli.errors import SpecliError, UsageError

if TYPE_CHECKING:
    from specli.session import SessionSpec


@dataclass(frozen=True)
class ResolvedModels:
    target: Path
    draft: Path | str  # a path, "ngram" or "none"
    draft_tokens: int | None = None  # the pair's default -k, if it sets one (-k not given)


def resolve_models(pair: str | None, target: str | Path | None, draft: str | None) -> ResolvedModels:
    """--target/--draft as given (a file, or a Hub reference pulled into the cache); -m PAIR through
    the registry (pulling missing files); neither: the embedded demo model with n-gram drafting."""
    if target is not None and pair is not None:
        raise SpecliError("give either -m PAIR or --target PATH, not both")
    if target is not None:
        return ResolvedModels(model_file(target), _draft_path_or_kind(draft or "ngram"))
    if pair is None:
        from specli.models.demo import embedded_model_path

        return ResolvedModels(embedded_model_path(), _draft_path_or_kind(draft or "ngram"))
    from specli.models import hub
    from specli.models.registry import load_registry

    entry = load_registry().get(pair)
    target_path, pair_draft = hub.resolve_pair(entry, download=True)
    chosen = _draft_path_or_kind(draft) if draft else (pair_draft or "none")
    return ResolvedModels(target_path, chosen, entry.draft_tokens)


def _draft_path_or_kind(draft: str | Path) -> Path | str:
    if isinstance(draft, str) and draft in ("ngram", "none"):
        return draft
    return model_file(draft)


def model_file(model: str | Path) -> Path:
    """A local file, which always wins; else a Hub reference (`owner/repo:QUANT`, `owner/repo/file.gguf`),
    pulled into the Hugging Face cache; else the path as given, for the loader to say what is wrong."""
    path = Path(model).expanduser()
    if path.exists() or "/" not in str(model):
        return path
    from specli.models import hub

    return hub.resolve_reference(str(model)) or path


def check_draft_spelling(draft: str | None) -> None:
    """--draft ngrm: a misspelt proposer, not a missing file."""
    import difflib

    if draft is None or draft in ("ngram", "none") or Path(draft).exists() or "/" in draft or "." in draft:
        return
    close = difflib.get_close_matches(draft, ["ngram", "none"], n=1, cutoff=0.6)
    if close:
        raise UsageError(f"--draft {draft}: no such file or proposer", f"did you mean --draft {close[0]}?")


def warn_if_self_drafting(spec: SessionSpec, stderr: IO[str]) -> None:
    """A draft that is the target itself costs as much as the target: it cannot speed anything up."""
    if isinstance(spec.draft, Path) and spec.draft.exists() and spec.draft.resolve() == spec.target.resolve():
        stderr.write("specli: warning: the draft is the target itself; drafting costs as much as it saves "
                     "(use --draft ngram, or a smaller model of the same family)\n")
