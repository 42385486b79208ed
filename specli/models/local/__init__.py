"""The models already on this machine, in other tools' stores (stores.py), what each is from
its header, and the target/draft pairs they form (catalog.py)."""

from __future__ import annotations

from pathlib import Path

from specli.config import cache_dir
from specli.models.local.catalog import LocalPair, Summary, SummaryCache, catalogue, pairs
from specli.models.local.stores import Store, find_files, resolve_ollama, stores

__all__ = ["LocalPair", "Summary", "draft_candidates", "local_models", "pairs", "resolve_ollama", "stores"]


def local_models(found_stores: list[Store] | None = None, cache: Path | None = None) -> tuple[list[Summary], list[str]]:
    """(every GGUF model in the stores, summarised from its header; one line per problem)."""
    files, problems = find_files(found_stores if found_stores is not None else stores())
    summary_cache = SummaryCache(cache if cache is not None else cache_dir() / "local-models.json")
    return catalogue(files, summary_cache, problems), problems


def draft_candidates(target: Path, name: str | None = None) -> tuple[Summary, list[LocalPair]]:
    """The target's summary, and the local models that can draft for it, best first: those that
    pass llama.cpp's vocabulary rule before those that draft through text, then the smallest
    (the cheapest to run) first."""
    from specli.models.local.catalog import summarise
    from specli.models.local.stores import LocalFile

    mine = summarise(LocalFile("file", name or target.name, target))
    summaries, _ = local_models()
    others = [s for s in summaries if Path(s.path).resolve() != target.resolve()]
    found = [pair for pair in pairs([mine, *others]) if pair.target is mine]
    return mine, sorted(found, key=lambda pair: (pair.through_text, pair.draft.size, pair.draft.name))
