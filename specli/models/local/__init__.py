"""The models already on this machine, in other tools' stores (stores.py), what each is from
its header, and the target/draft pairs they form (catalog.py)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Optional

from specli.config import cache_dir
from specli.models.local.catalog import LocalPair, Summary, SummaryCache, catalogue, pairs
from specli.models.local.stores import Store, find_files, resolve_ollama, stores

__all__ = ["HubCandidate", "LocalPair", "Summary", "draft_candidates", "hub_candidates", "local_models", "pairs",
           "remote_summary", "resolve_ollama", "stores"]


def local_models(found_stores: list[Store] | None = None, cache: Path | None = None) -> tuple[list[Summary], list[str]]:
    """(every GGUF model in the stores, summarised from its header, each with the projector
    beside it where there is one; one line per problem). A projector (`general.architecture`
    clip) is no model: never a target or a draft candidate."""
    files, problems = find_files(found_stores if found_stores is not None else stores())
    summary_cache = SummaryCache(cache if cache is not None else cache_dir() / "local-models.json")
    summaries = catalogue(files, summary_cache, problems)
    projectors: dict[Path, str] = {}
    for summary in summaries:
        if summary.architecture == PROJECTOR:
            projectors.setdefault(Path(summary.path).parent, summary.path)
    return [replace(summary, projector=projectors.get(Path(summary.path).parent, ""))
            for summary in summaries if summary.architecture != PROJECTOR], problems


PROJECTOR = "clip"  # general.architecture of an image projector (mmproj) GGUF
Speedup = Callable[[Path, Path], Optional[float]]  # (target, draft): a stored measurement's expected gain


def draft_candidates(target: Path | Summary, name: str | None = None,
                     speedup: Speedup | None = None) -> tuple[Summary, list[LocalPair]]:
    """The target's summary (`target`: a file, or a summary, such as a Hub file's from its
    header), and the local models that can draft for it, best first: those
    whose measured speed-up (`speedup`, where one is stored) is above 1, highest first; then
    the unmeasured, those that pass llama.cpp's vocabulary rule before those that draft through
    text, the smallest (the cheapest to run) first; then the measured ones that would lose."""
    from specli.models.local.catalog import summarise
    from specli.models.local.stores import LocalFile

    mine = target if isinstance(target, Summary) else summarise(LocalFile("file", name or target.name, target))
    here = Path(mine.path).resolve() if not mine.path.startswith("hf://") else None
    summaries, _ = local_models()
    others = [s for s in summaries if Path(s.path).resolve() != here]
    found = [pair for pair in pairs([mine, *others]) if pair.target is mine]

    def rank(pair: LocalPair) -> tuple:
        gain = speedup(Path(mine.path), Path(pair.draft.path)) if speedup is not None and here else None
        if gain is None:
            return (1, pair.through_text, pair.draft.size, pair.draft.name)
        return (0 if gain > 1 else 2, -gain, pair.draft.name)

    return mine, sorted(found, key=rank)


@dataclass(frozen=True)
class HubCandidate:
    draft: Summary  # path: hf://REPO/FILE
    through_text: bool
    fetched: int  # bytes of its header read over the network


HUB_REPOS = 8  # repos of a Hub search whose smallest GGUF is looked at


def remote_summary(reference: str) -> Summary | None:
    """A Hub reference's summary from its header, read remotely (None: not a Hub reference)."""
    from specli.models.hub.headers import reference_header
    from specli.models.local.catalog import summary_from_metadata

    header = reference_header(reference)
    if header is None:
        return None
    return summary_from_metadata("hub", reference, f"hf://{header.repo}/{header.filename}", header.size or 0,
                                 header.metadata)


def hub_candidates(target: Summary, query: str | None = None,
                   repos: int = HUB_REPOS) -> tuple[list[HubCandidate], list[str]]:
    """GGUFs on the Hub that can draft for `target`, best first (as draft_candidates orders them):
    the repos a search for the target's family finds, each one's smallest GGUF under half the
    target's size, checked from its header alone (range requests: nothing is downloaded). One
    line per repo that could not be read."""
    from specli.errors import SpecliError
    from specli.models.hub.headers import fetch_metadata, gguf_files, search_gguf_repos
    from specli.models.local.catalog import drafts_directly, same_texts, summary_from_metadata

    words = query or (target.basename if target.basename != "-" else target.architecture)
    found, problems = [], []
    for repo in search_gguf_repos(words, repos):
        try:
            sizes = sorted((size, name) for name, size in gguf_files(repo).items()
                           if size is not None and size < target.size / 2)
            if not sizes:
                continue
            size, name = sizes[0]
            header = fetch_metadata(repo, name, size)
        except SpecliError as error:
            problems.append(f"{repo}: {error.message}")
            continue
        except Exception as error:  # noqa: BLE001 - huggingface_hub's own errors: one line per repo
            problems.append(f"{repo}: {type(error).__name__}: {error}")
            continue
        summary = summary_from_metadata("hub", f"{repo}/{name}", f"hf://{repo}/{name}", size, header.metadata)
        mine, theirs = target.vocabulary, summary.vocabulary
        if mine is None or theirs is None or mine.model != theirs.model or not same_texts(mine, theirs):
            continue
        found.append(HubCandidate(summary, not drafts_directly(mine, theirs), header.fetched))
    return sorted(found, key=lambda c: (c.through_text, c.draft.size, c.draft.name)), problems
