"""Where costs are stored: one CostStore file, keyed so that no other model file, setting,
llama.cpp build, device or set of RPC servers steers a run.

A target's key (`settings_key`) holds its curve; what is measured beside it is stored under
`key.beside(name)`: the NextN layers' measurements ("mtp"), a first run's busy finding
("busy"), the exact batch sizes ("exact"), and a drafter's catch-up, agreement and speed-up
("catch_up", "acceptance", "speedup" beside the drafter's own key). A draft model's key
(`draft_key`) is its target's, then the draft file and its settings; each draft kind's
record (specli/drafts.py, `cost_key`) says which of these its drafter's is. The strings are the
stored keys themselves (tests/data/costs_keys*.json): a change to them measures everything
again, so it goes with a version."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from specli.config import cache_dir
from specli.decode.costs import CostStore
from specli.llama.backend import LoadSettings, library_versions
from specli.llama.devices import compute_fingerprint

COSTS_VERSION = 4  # part of every key: a change in how costs are measured measures again
# Part of exact_key: a change in how exact batch sizes are measured or stored measures them
# again (2: a BatchCap of spans of the context, rows with and without logits).
EXACT_VERSION = 2

# What is stored beside a key: the NextN layers' measurements, a busy finding, exact batch
# sizes; a drafter's catch-up per token, greedy agreement and measured speed-up.
Beside = Literal["mtp-v2", "nextn", "busy", "exact", "catch_up", "acceptance", "depths", "speedup"]


class StoreKey(str):
    """A key of the cost store, as stored; `beside` names what is stored next to it."""

    def beside(self, name: Beside) -> StoreKey:
        return StoreKey(f"{self}|{name}")


def cost_store() -> CostStore:
    """The one file that holds stored costs, exact batch sizes and draft measurements."""
    return CostStore(cache_dir() / "costs.json")


def build_key() -> str:
    """The llama.cpp build and the devices it sees, as stored costs are keyed by them."""
    return f"{library_versions()['llama_cpp_python']}|{compute_fingerprint()}"


def settings_key(path: Path, load: LoadSettings, build: str) -> StoreKey:
    """Stored costs and exactness hold for this model file, its settings, this llama.cpp build
    and devices (`build`: build_key()), and the RPC servers it runs on."""
    info = path.stat()
    parts = (path.resolve(), info.st_size, info.st_mtime_ns, load.gpu_layers, load.threads, load.repack,
             load.ctx_size, build, f"v{COSTS_VERSION}")
    return StoreKey("|".join(str(part) for part in parts) + _servers_key(load))


def exact_key(path: Path, load: LoadSettings, build: str) -> StoreKey:
    """Where the exact verify batch sizes of a model and its settings are stored."""
    return StoreKey(settings_key(path, load, build).beside("exact") + f"|v{EXACT_VERSION}")


def draft_key(target_key: str, draft: Path, load: LoadSettings) -> StoreKey:
    """Where a draft model's cost per token is stored: with its target's key, as it runs beside it."""
    info = draft.stat()
    return StoreKey(f"{target_key}|draft:{draft.resolve()}|{info.st_size}|{info.st_mtime_ns}|{load.gpu_layers}"
                    f"{_servers_key(load)}")


@dataclass(frozen=True)
class CostsKey:
    """What a stored curve's key says: the model file and the settings and build it holds for."""

    path: Path
    load: LoadSettings
    build: str
    version: int


def parse_settings_key(key: str) -> CostsKey | None:
    """settings_key's parts again (None: not a key of stored costs, or of a format it cannot read)."""
    head, _, servers = key.partition("|rpc:")
    parts = head.split("|")
    try:
        path, _, _, layers, threads, repack, ctx_size = parts[:7]
        build, version = "|".join(parts[7:-1]), int(parts[-1].removeprefix("v"))
        load = LoadSettings(int(layers), ctx_size=int(ctx_size), threads=None if threads == "None" else int(threads),
                            repack=repack == "True", rpc=tuple(servers.split(",")) if servers else ())
    except (ValueError, IndexError):
        return None
    return CostsKey(Path(path), load, build, version)


def _servers_key(load: LoadSettings) -> str:
    """The RPC servers a model spreads over (nothing without --rpc, so the keys stored
    before --rpc existed still hold)."""
    return f"|rpc:{','.join(load.rpc)}" if load.rpc else ""
