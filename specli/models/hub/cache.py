"""The Hugging Face cache on disk: where it is, what of a pair it holds, and removing a pair's files.

Layout (huggingface_hub's, shared with `hf` and every library built on it): a `models--<owner>--<name>`
folder per repo, holding `blobs/<etag>` (the content), `snapshots/<commit>/<file>` (links into blobs),
`refs/<branch>` (the commit a branch pointed to) and, while huggingface_hub downloads a blob,
`blobs/<etag>.<random>.incomplete`, under the lock `.locks/models--<owner>--<name>/<etag>.lock`.
Nothing here touches the network.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from filelock import FileLock, Timeout
from huggingface_hub import CachedRepoInfo, constants, scan_cache_dir, try_to_load_from_cache
from huggingface_hub.errors import CacheNotFound

from specli.models.registry import ModelRef, Pair, Registry


def hub_cache_dir() -> Path:
    """The Hugging Face cache: `HF_HUB_CACHE`, else `HF_HOME/hub`, else huggingface_hub's default."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path(constants.HF_HUB_CACHE)


def free_space(path: Path) -> int | None:
    """Free bytes on the disk that holds `path` (or would, once it is created); None if unknown."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def format_size(size: Optional[int]) -> str:
    """Decimal units, as the Hub shows them: `4.7 GB`."""
    if size is None:
        return "?"
    units = ("B", "kB", "MB", "GB", "TB")
    value, unit = float(size), 0
    while value >= 1000 and unit < len(units) - 1:
        value, unit = value / 1000, unit + 1
    return f"{size} B" if unit == 0 else f"{value:.1f} {units[unit]}"


def repo_cache(repo: str) -> Path:
    return hub_cache_dir() / f"models--{repo.replace('/', '--')}"


def cached_parts(ref: ModelRef) -> list[Path | None]:
    """The cached file of each part at the ref's revision, or None where a part is missing."""
    found = []
    for filename in ref.files:
        path = try_to_load_from_cache(ref.repo, filename, cache_dir=hub_cache_dir(), revision=ref.revision or "main")
        found.append(Path(path) if isinstance(path, str) else None)
    return found


def cached_repo(repo: str) -> CachedRepoInfo | None:
    """What the cache holds of a model repo, as huggingface_hub's cache scan reads it (every
    cached revision and its files); None when it holds nothing of it."""
    try:
        info = scan_cache_dir(hub_cache_dir())
    except CacheNotFound:
        return None
    return next((found for found in info.repos if found.repo_id == repo and found.repo_type == "model"), None)


def cached_repo_files(repo: str) -> list[str]:
    """The files of the repo's cached snapshot of `main`, as paths in the repo."""
    found = cached_repo(repo)
    main = next((revision for revision in found.revisions if "main" in revision.refs), None) if found else None
    if main is None:
        return []
    return sorted(file.file_path.relative_to(main.snapshot_path).as_posix() for file in main.files)


# --- unfinished downloads -----------------------------------------------------------------------


def stale_partials(repo: str) -> list[Path]:
    """The repo's unfinished downloads that no process is writing any more.

    huggingface_hub holds the blob's lock for the whole download and deletes its partial when the
    download fails, so a partial whose lock is free was left by a killed process. No download
    continues it: huggingface_hub starts each download in a new file.
    """
    blobs = repo_cache(repo) / "blobs"
    partials = sorted(blobs.glob("*.incomplete")) if blobs.is_dir() else []
    return [partial for partial in partials if not _being_written(partial)]


def _being_written(partial: Path) -> bool:
    etag = partial.name.split(".")[0]
    lock = hub_cache_dir() / ".locks" / partial.parent.parent.name / f"{etag}.lock"
    if not lock.exists():
        return False
    try:
        with FileLock(lock).acquire(timeout=0):
            return False
    except (Timeout, NotImplementedError):  # held, or a filesystem without flock: leave the file alone
        return True


def discard_stale_partials(repos: set[str]) -> int:
    """Delete what killed downloads left in these repos; returns the bytes freed."""
    freed = 0
    for repo in sorted(repos):
        for partial in stale_partials(repo):
            freed += partial.stat().st_size
            partial.unlink(missing_ok=True)
    return freed


# --- status: what is on disk --------------------------------------------------------------------


@dataclass(frozen=True)
class CachedFile:
    filename: str
    path: Optional[Path]
    size: Optional[int]


@dataclass(frozen=True)
class ModelStatus:
    role: str
    ref: ModelRef
    files: list[CachedFile]
    downloaded: bool

    @property
    def path(self) -> Optional[Path]:
        return self.files[0].path if self.files else None

    @property
    def size(self) -> Optional[int]:
        sizes = [file.size for file in self.files if file.size is not None]
        return sum(sizes) if sizes else None


@dataclass(frozen=True)
class PairStatus:
    pair: Pair
    models: list[ModelStatus]

    @property
    def downloaded(self) -> bool:
        return all(model.downloaded for model in self.models)

    @property
    def state(self) -> str:
        if self.downloaded:
            return "downloaded"
        present = any(file.path for model in self.models for file in model.files)
        return "partial" if present else "missing"

    @property
    def size(self) -> Optional[int]:
        sizes = [model.size for model in self.models if model.size is not None]
        return sum(sizes) if sizes else None


def pair_status(pair: Pair) -> PairStatus:
    """Which of the pair's files are on disk, where, and how big."""
    return PairStatus(pair=pair, models=[_model_status(role, ref) for role, ref in pair.models()])


def _model_status(role: str, ref: ModelRef) -> ModelStatus:
    if ref.path is not None:
        present = ref.path.is_file()
        file = CachedFile(ref.path.name, ref.path if present else None, ref.path.stat().st_size if present else None)
        return ModelStatus(role, ref, [file], present)
    if ref.package is not None:
        from specli.models.demo import embedded_model

        installed = _package_installed(ref.package)
        embedded = embedded_model() if installed else None
        if embedded is None:
            return ModelStatus(role, ref, [], installed)
        file = CachedFile(embedded.path.name, embedded.path if embedded.assembled else None, embedded.size)
        return ModelStatus(role, ref, [file], installed)
    files = [
        CachedFile(filename, path, path.stat().st_size if path else None)
        for filename, path in zip(ref.files, cached_parts(ref))
    ]
    return ModelStatus(role, ref, files, all(file.path for file in files))


def _package_installed(package: str) -> bool:
    try:
        importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


# --- removing -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Removal:
    """The cache entries `rm` deletes for a pair, and the shared files it keeps."""

    pair: Pair
    entries: list[Path]  # snapshot entries (symlinks into blobs/, or plain files), then unfinished downloads
    blobs: list[Path]  # blobs no other entry uses
    kept: list[tuple[str, str]]  # (repo/file, the downloaded pair that still uses it)

    @property
    def freed(self) -> int:
        plain = [entry for entry in self.entries if not entry.is_symlink()]
        return sum(path.stat().st_size for path in [*self.blobs, *plain])


def plan_removal(pair: Pair, registry: Registry) -> Removal:
    """The pair's files in the cache, minus those another downloaded pair also uses."""
    others = [other for other in registry.pairs.values() if other.name != pair.name]
    entries: list[Path] = []
    partials: dict[Path, None] = {}
    kept: list[tuple[str, str]] = []
    for _, ref in pair.models():
        if ref.repo is None:
            continue
        for filename in ref.files:
            user = _downloaded_user(ref.repo, filename, others)
            if user:
                kept.append((f"{ref.repo}/{filename}", user))
            else:
                entries.extend(_snapshot_entries(ref.repo, filename))
                partials.update(dict.fromkeys(stale_partials(ref.repo)))
    return Removal(pair=pair, entries=[*entries, *partials], blobs=_orphaned_blobs(entries), kept=kept)


def remove_files(removal: Removal) -> list[Path]:
    """Delete the planned entries and blobs, then any repo folder left without files."""
    _delete(removal.entries, removal.blobs)
    return removal.entries


def remove_entry(entry: Path) -> None:
    """Take one snapshot entry out of the cache, with its blob unless another entry still links to it."""
    _delete([entry], _orphaned_blobs([entry]))


def _delete(entries: list[Path], blobs: list[Path]) -> None:
    repos = {_repo_folder_of(entry) for entry in entries}
    for path in [*entries, *blobs]:
        path.unlink(missing_ok=True)
    for repo in repos:
        _prune(repo)


def _downloaded_user(repo: str, filename: str, others: list[Pair]) -> Optional[str]:
    for other in others:
        uses = any(ref.repo == repo and filename in ref.files for _, ref in other.models())
        if uses and pair_status(other).downloaded:
            return other.name
    return None


def _repo_folder_of(entry: Path) -> Path:
    """The `models--owner--name` folder that holds a snapshot entry or a blob."""
    cache = hub_cache_dir()
    return cache / entry.relative_to(cache).parts[0]


def _snapshot_entries(repo: str, filename: str) -> list[Path]:
    """The file in every cached revision of the repo. (huggingface_hub's cache scan deletes
    whole revisions and skips a repo with a broken link; `rm` takes one pair's files out of
    each revision, and out of a damaged cache too.)"""
    snapshots = repo_cache(repo) / "snapshots"
    if not snapshots.is_dir():
        return []
    return [snapshot / filename for snapshot in sorted(snapshots.iterdir()) if os.path.lexists(snapshot / filename)]


def _orphaned_blobs(entries: list[Path]) -> list[Path]:
    """Blobs behind the entries that no remaining entry of the same repo points to."""
    leaving = set(entries)
    blobs: dict[Path, None] = {}
    for repo in {_repo_folder_of(entry) for entry in entries}:
        staying = {
            path.resolve()
            for path in (repo / "snapshots").rglob("*")
            if path.is_symlink() and path not in leaving
        }
        for entry in entries:
            if entry.is_symlink() and _repo_folder_of(entry) == repo and entry.resolve() not in staying:
                blobs[entry.resolve()] = None
    return [blob for blob in blobs if blob.is_file()]


def _prune(repo: Path) -> None:
    """Remove empty snapshot folders, and the whole repo folder once no snapshot holds a file
    (unless a download is writing into it)."""
    snapshots = repo / "snapshots"
    for folder in sorted(snapshots.rglob("*"), key=lambda path: len(path.parts), reverse=True):
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
    downloading = any(_being_written(partial) for partial in (repo / "blobs").glob("*.incomplete"))
    if not downloading and (not snapshots.is_dir() or not any(snapshots.iterdir())):
        shutil.rmtree(repo, ignore_errors=True)
        shutil.rmtree(hub_cache_dir() / ".locks" / repo.name, ignore_errors=True)
