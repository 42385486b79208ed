"""The models already on this machine, in other tools' stores (stores.py), what each is from
its header, and the target/draft pairs they form (catalog.py)."""

from __future__ import annotations

from pathlib import Path

from specli.config import cache_dir
from specli.models.local.catalog import LocalPair, Summary, SummaryCache, catalogue, pairs
from specli.models.local.stores import Store, find_files, resolve_ollama, stores

__all__ = ["LocalPair", "Summary", "local_models", "pairs", "resolve_ollama", "stores"]


def local_models(found_stores: list[Store] | None = None, cache: Path | None = None) -> tuple[list[Summary], list[str]]:
    """(every GGUF model in the stores, summarised from its header; one line per problem)."""
    files, problems = find_files(found_stores if found_stores is not None else stores())
    summary_cache = SummaryCache(cache if cache is not None else cache_dir() / "local-models.json")
    return catalogue(files, summary_cache, problems), problems
