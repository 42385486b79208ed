"""Which model files a command runs: -m PAIR through the registry, --target/--draft as files
or Hub references, or the embedded model."""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Callable

from specli.decode.request import DraftKind
from specli.errors import SpecliError


@dataclass(frozen=True)
class ResolvedModels:
    target: Path
    draft: str = DraftKind.NGRAM  # the draft kind, by name (specli/drafts.py)
    draft_model: Path | None = None  # with the draft kind "model"
    draft_tokens: int | None = None  # the pair's default -k, if it sets one (-k not given)
    projector: Path | None = None  # the pair's image projector, where it has one
    reference: str | None = None  # the target as given, where it is a Hub reference (its repo may hold a projector)
    nextn_file: Path | None = None  # with the draft kind "mtp": the MTP file named for a trunk-only target


def resolve_models(pair: str | None, target: str | Path | None, draft: str | None) -> ResolvedModels:
    """--target/--draft as given (a file, or a Hub reference pulled into the cache); -m PAIR through
    the registry (pulling missing files); neither: the embedded demo model with n-gram drafting.
    `draft` is a model here: a draft kind's name (ngram, auto) is specli/drafts.py's to read."""
    if target is not None and pair is not None:
        raise SpecliError("give either -m PAIR or --target PATH, not both")
    if target is not None:
        resolved = _with_draft(model_file(target), draft)
        return replace(resolved, reference=str(target)) if _is_hub_reference(str(target)) else resolved
    if pair is None:
        from specli.models.demo import embedded_model_path

        return _with_draft(embedded_model_path(), draft)
    from specli.models import hub
    from specli.models.registry import load_registry

    entry = load_registry().get(pair)
    target_path, pair_draft = hub.resolve_pair(entry, download=True)
    projector = hub.resolve_model(entry.projector, download=False, pair_name=entry.name) if entry.projector else None
    if draft:
        return replace(_with_draft(target_path, draft), draft_tokens=entry.draft_tokens, projector=projector)
    return ResolvedModels(target_path, entry.draft_kind, pair_draft, entry.draft_tokens, projector)


def _is_hub_reference(given: str) -> bool:
    """Whether model_file read `given` as a Hub reference (no such local file, nor an Ollama name)."""
    if Path(given).expanduser().exists() or given.startswith("ollama:") or "/" not in given:
        return False
    from specli.models import hub

    return hub.parse_reference(given) is not None


def _with_draft(target: Path, draft: str | None) -> ResolvedModels:
    """--draft MODEL (a file, an Ollama model or a Hub reference), or none given: n-gram lookup."""
    if draft is None:
        return ResolvedModels(target, DraftKind.NGRAM)
    return ResolvedModels(target, DraftKind.MODEL, model_file(draft))


def auto_draft(target: Path, notice: Callable[[str], None] | None = None,
               speedup: Callable[[Path, Path], float | None] | None = None) -> Path | None:
    """--draft auto: the first of `specli drafts` for the target (by its stored speed-up where
    `speedup` has one, else a model that passes llama.cpp's vocabulary rule before one that
    drafts through text, the smallest first); None where there is none, or where the best
    measured one would lose (n-gram lookup drafts). One line on stderr names the choice."""
    from specli.models.local import draft_candidates

    say = notice or (lambda line: print(f"specli: {line}", file=sys.stderr))
    if not target.is_file():
        return None  # the loader says what is wrong with it
    mine, candidates = draft_candidates(target, speedup=speedup)
    if not candidates:
        say("--draft auto: no model on this machine shares the target's vocabulary; drafting with n-gram lookup")
        return None
    best = candidates[0]
    how = " (through text)" if best.through_text else ""
    gain = speedup(target, Path(best.draft.path)) if speedup is not None else None
    if gain is not None and gain <= 1:
        say(f"--draft auto: the best draft measured, {best.draft.name}, would lose ({gain:.2f}x); "
            "drafting with n-gram lookup")
        return None
    measured = f", measured {gain:.2f}x" if gain is not None else ""
    say(f"--draft auto: drafting with {best.draft.name}{how}, {best.draft.size / mine.size:.0%} of the target's size"
        f"{measured}")
    return Path(best.draft.path)


def model_file(model: str | Path) -> Path:
    """A local file, which always wins; else an Ollama model (`ollama:NAME[:TAG]`, its blob used
    where it lies); else a Hub reference (`owner/repo:QUANT`, `owner/repo/file.gguf`), pulled into
    the Hugging Face cache; else the path as given, for the loader to say what is wrong."""
    path = Path(model).expanduser()
    if not path.exists() and str(model).startswith("ollama:"):
        from specli.models.local.stores import resolve_ollama

        return resolve_ollama(str(model))
    if path.exists() or "/" not in str(model):
        return path
    from specli.models import hub

    return hub.resolve_reference(str(model)) or path


def projector(models: ResolvedModels) -> Path | None:
    """The target's image projector where one is to be had: the pair's, else an mmproj GGUF
    beside the target, else, for a Hub reference, its repo's (pulled, as llama.cpp's `-hf` does)."""
    if models.projector is not None:
        return models.projector
    beside = projector_beside(models.target) if models.target.is_file() else None
    if beside is not None or models.reference is None:
        return beside
    from specli.models import hub

    return hub.projector_for(models.reference)


def projector_beside(model: Path) -> Path | None:
    """The projector beside a model file, as llama.cpp names them: an `mmproj*.gguf` in its folder
    (of several, the one whose name shares most with the model's)."""
    found = sorted(path for path in model.parent.glob("*.gguf") if "mmproj" in path.name.lower() and path != model)
    if not found:
        return None
    stem = model.stem.lower()
    return max(found, key=lambda path: (_shared_prefix(path.stem.lower().replace("mmproj-", ""), stem), path.name))


def _shared_prefix(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def warn_if_self_drafting(models: ResolvedModels, stderr: IO[str]) -> None:
    """A draft that is the target itself costs as much as the target: it cannot speed anything up."""
    draft = models.draft_model
    if draft is not None and draft.exists() and draft.resolve() == models.target.resolve():
        stderr.write("specli: warning: the draft is the target itself; drafting costs as much as it saves "
                     "(use --draft ngram, or a smaller model of the same family)\n")
