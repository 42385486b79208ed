"""Model files from the Hugging Face Hub: resolve, pull, report and remove. The only importer of huggingface_hub.

Files live in the standard Hugging Face cache (`HF_HOME`, `HF_HUB_CACHE`), so other tools reuse them.
A pull that is cut, interrupted or killed goes on where it stopped the next time (see `_download`).
`HF_ENDPOINT`, `HF_TOKEN` and `HF_HUB_OFFLINE` are honoured; they are read when a function runs,
not when this module is imported.
"""

from __future__ import annotations

import errno
import hashlib
import importlib.metadata
import os
import shutil
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Literal, Optional

import httpx2
from huggingface_hub import HfFileMetadata, constants, get_hf_file_metadata, hf_hub_url, try_to_load_from_cache

# Private helpers too (pyproject pins huggingface_hub <3): specli lays a pulled file out with
# huggingface_hub's own steps, exactly as `hf download` would, and fetches it with its resumable GET.
from huggingface_hub._local_folder import _create_cachedir_tag
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import (
    _cache_commit_hash_for_specific_revision,
    _create_symlink,
    http_get,
    repo_folder_name,
)
from huggingface_hub.utils import WeakFileLock, build_hf_headers
from huggingface_hub.utils._http import _is_same_or_hub_host
from tqdm import tqdm

from specli.errors import HubError, ModelFileError, OfflineError
from specli.registry import ModelRef, Pair, Registry

GGUF_MAGIC = b"GGUF"
Draft = Literal["ngram"]


# --- settings, read from the environment at call time -------------------------------------------


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", constants.ENDPOINT).rstrip("/")


def hub_cache_dir() -> Path:
    """The Hugging Face cache: `HF_HUB_CACHE`, else `HF_HOME/hub`, else huggingface_hub's default."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path(constants.HF_HUB_CACHE)


def hub_offline() -> bool:
    return constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"}


def format_size(size: Optional[int]) -> str:
    """Decimal units, as the Hub shows them: `4.7 GB`."""
    if size is None:
        return "?"
    units = ("B", "kB", "MB", "GB", "TB")
    value, unit = float(size), 0
    while value >= 1000 and unit < len(units) - 1:
        value, unit = value / 1000, unit + 1
    return f"{size} B" if unit == 0 else f"{value:.1f} {units[unit]}"


# --- resolving: a local path for each model of a pair -------------------------------------------


def resolve_pair(pair: Pair, *, download: bool = True) -> tuple[Path, Path | Draft]:
    """Local paths of the target and the draft (or "ngram"), pulling missing files when allowed."""
    if download and not hub_offline() and not pair_status(pair).downloaded:
        return pull_pair(pair)
    target = resolve_model(pair.target, download=False, pair_name=pair.name)
    if not isinstance(pair.draft, ModelRef):
        return target, pair.draft
    return target, resolve_model(pair.draft, download=False, pair_name=pair.name)


def resolve_model(ref: ModelRef, *, download: bool = True, pair_name: str | None = None) -> Path:
    """The local file of one model (part 1 of a split GGUF); downloads it when missing and allowed."""
    if ref.path is not None:
        return _checked_local(ref.path)
    if ref.package is not None:
        from specli.demo import embedded_model_path

        return embedded_model_path()
    cached = _cached_parts(ref)
    if all(cached):
        for path in cached:
            _check_magic(path, pair_name)
        return cached[0]
    if not download or hub_offline():
        missing = ref.files[cached.index(None)]
        raise OfflineError(
            f"{ref.repo}/{missing} is not downloaded" + (" and downloads are off (HF_HUB_OFFLINE)" if hub_offline() else ""),
            hint=f"run: specli pull {pair_name}" if pair_name else f"run: hf download {ref.repo} {missing}",
        )
    files = _plan_model("model", ref)
    check_disk_space(files, pair_name or ref.label)
    return _fetch(files, pair_name)[0]


def _checked_local(path: Path) -> Path:
    if not path.is_file():
        raise ModelFileError(f"model file not found: {path}", hint="check 'path' in models.toml")
    _check_magic(path, None)
    return path


def _cached_parts(ref: ModelRef) -> list[Path | None]:
    """The cached file of each part at the ref's revision, or None where a part is missing."""
    found = []
    for filename in ref.files:
        path = try_to_load_from_cache(ref.repo, filename, cache_dir=hub_cache_dir(), revision=ref.revision or "main")
        found.append(Path(path) if isinstance(path, str) else None)
    return found


# --- planning: what a pull would fetch ----------------------------------------------------------


@dataclass(frozen=True)
class HubFile:
    """One file of a model in a Hub repo, and where it stands in the local cache."""

    role: str
    repo: str
    filename: str
    revision: str  # as the registry asks for it: a branch, tag or commit (default "main")
    size: Optional[int]
    cached: Optional[Path]  # the snapshot entry, when this revision of the file is in the cache
    sha256: Optional[str] = None
    in_blobs: bool = False  # same content already cached under another revision: nothing to fetch
    commit: Optional[str] = None  # the commit the Hub resolved the revision to; every part comes from it
    etag: Optional[str] = None  # names the blob, and the partial an interrupted pull left
    resumed: int = 0  # bytes an interrupted pull already left in `blobs/<etag>.incomplete`

    @property
    def fetch_size(self) -> int:
        """Bytes a pull still transfers for this file (0 when unknown)."""
        return 0 if self.cached or self.in_blobs else max((self.size or 0) - self.resumed, 0)


@dataclass(frozen=True)
class PullPlan:
    pair: Pair
    files: list[HubFile]

    @property
    def download_size(self) -> int:
        """Bytes to fetch, counting only the files whose size the Hub reported."""
        return sum(file.fetch_size for file in self.files)


def plan_pull(pair: Pair) -> PullPlan:
    """Ask the Hub (one HEAD per file) what pulling the pair fetches; cached files only when offline."""
    files: list[HubFile] = []
    for role, ref in pair.models():
        if ref.repo is not None:
            files.extend(_plan_model(role, ref, pair.name))
    return PullPlan(pair=pair, files=files)


def _plan_model(role: str, ref: ModelRef, pair_name: str | None = None) -> list[HubFile]:
    if hub_offline():
        return _plan_offline(role, ref, pair_name)
    revision = ref.revision or "main"
    commit = revision
    planned = []
    for filename in ref.files:
        with _hub_errors(ref.repo, filename, revision):
            url = hf_hub_url(ref.repo, filename, revision=commit, endpoint=hub_endpoint())
            metadata = get_hf_file_metadata(url, endpoint=hub_endpoint())
        commit = metadata.commit_hash or commit  # later parts come from the same commit
        cached = try_to_load_from_cache(ref.repo, filename, cache_dir=hub_cache_dir(), revision=commit)
        blob = _repo_cache(ref.repo) / "blobs" / metadata.etag if metadata.etag else None
        planned.append(
            HubFile(
                role=role,
                repo=ref.repo,
                filename=filename,
                revision=revision,
                size=metadata.size,
                cached=Path(cached) if isinstance(cached, str) else None,
                sha256=ref.sha256,
                in_blobs=blob is not None and blob.is_file(),
                commit=commit,
                etag=metadata.etag,
                resumed=_resumable_bytes(blob, metadata.size) if blob else 0,
            )
        )
    return planned


def _partial_path(blob: Path) -> Path:
    """Where a blob grows until it is complete: `blobs/<etag>.incomplete`, one name for every process.

    (huggingface_hub 2.x writes `<etag>.<random>.incomplete` and deletes it when a download fails;
    `hf cache ls` and `hf cache prune` see both kinds as incomplete downloads.)
    """
    return blob.with_name(f"{blob.name}.incomplete")


def _resumable_bytes(blob: Path, size: Optional[int]) -> int:
    """Bytes an interrupted pull left for this blob that the next pull continues from."""
    try:
        done = _partial_path(blob).stat().st_size
    except OSError:
        return 0
    return done if size is not None and done <= size else 0


def _plan_offline(role: str, ref: ModelRef, pair_name: str | None) -> list[HubFile]:
    planned = []
    for filename, cached in zip(ref.files, _cached_parts(ref)):
        if cached is None:
            raise OfflineError(
                f"{ref.repo}/{filename} is not in the cache and downloads are off (HF_HUB_OFFLINE)",
                hint=f"unset HF_HUB_OFFLINE and run: specli pull {pair_name or ref.repo}",
            )
        size = cached.stat().st_size
        planned.append(HubFile(role, ref.repo, filename, ref.revision or "main", size, cached, ref.sha256))
    return planned


def check_disk_space(files: list[HubFile], what: str) -> None:
    """Refuse to start a download that cannot fit, when the Hub told us the sizes."""
    needed = sum(file.fetch_size for file in files)
    if not needed:
        return
    cache = hub_cache_dir()
    free = shutil.disk_usage(_existing_ancestor(cache)).free
    if needed > free:
        raise HubError(
            f"not enough disk space for {what}: {format_size(needed)} to download, {format_size(free)} free in {cache}",
            hint="free some space, or point HF_HOME (or HF_HUB_CACHE) at a disk with room",
        )


def _existing_ancestor(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


# --- pulling ------------------------------------------------------------------------------------


def pull_pair(pair: Pair, plan: PullPlan | None = None) -> tuple[Path, Path | Draft]:
    """Download whatever the pair lacks, verify it, and return the target and draft paths."""
    plan = plan or plan_pull(pair)
    check_disk_space(plan.files, pair.name)
    if plan.download_size:
        _say(f"pulling {pair.name}: {format_size(plan.download_size)} to download")
    target = _pulled_model("target", pair.target, plan, pair.name)
    if not isinstance(pair.draft, ModelRef):
        return target, pair.draft
    return target, _pulled_model("draft", pair.draft, plan, pair.name)


def _pulled_model(role: str, ref: ModelRef, plan: PullPlan, pair_name: str) -> Path:
    if ref.repo is None:
        return resolve_model(ref, pair_name=pair_name)
    return _fetch([file for file in plan.files if file.role == role], pair_name)[0]


def _fetch(files: list[HubFile], pair_name: str | None) -> list[Path]:
    """The snapshot entry of each file of one model, downloading the files that are not cached.

    The plan pinned every file to the commit the first one's revision resolved to, so the parts
    of a split GGUF all come from that one commit.
    """
    paths: list[Path] = []
    for file in files:
        if file.cached is not None:
            _check_magic(file.cached, pair_name)
            paths.append(file.cached)
            continue
        with _hub_errors(file.repo, file.filename, file.revision):
            paths.append(_download(file))
    return paths


def _download(file: HubFile) -> Path:
    """Put one file in the cache as huggingface_hub lays it out, through a partial that outlives the process.

    `blobs/<etag>.incomplete` grows by `Range` requests until it has the size the Hub announced; only
    then, verified, is it renamed to `blobs/<etag>` and linked from `snapshots/<commit>/<filename>`.
    A killed pull leaves the partial for the next pull to continue. Changed content has another etag,
    so it never continues an old partial. The lock is the one huggingface_hub takes for the blob:
    `hf download` and specli never write the same blob at once.
    """
    url = hf_hub_url(file.repo, file.filename, revision=file.commit or file.revision, endpoint=hub_endpoint())
    metadata = get_hf_file_metadata(url, endpoint=hub_endpoint())  # asked again: signed download URLs expire
    if metadata.commit_hash is None or metadata.etag is None:
        raise HubError(
            f"{hub_endpoint()} sent {file.repo}/{file.filename} without a commit or an etag",
            hint="check that HF_ENDPOINT points to a Hugging Face Hub or a mirror of one",
        )
    storage = _repo_cache(file.repo)
    blob = storage / "blobs" / metadata.etag
    pointer = storage / "snapshots" / metadata.commit_hash / file.filename
    lock = hub_cache_dir() / ".locks" / storage.name / f"{metadata.etag}.lock"
    for folder in (blob.parent, pointer.parent, lock.parent):
        folder.mkdir(parents=True, exist_ok=True)
    _create_cachedir_tag(hub_cache_dir())
    with WeakFileLock(lock):
        new_blob = not blob.is_file()  # else another process finished it, maybe while we waited for the lock
        candidate = _partial_path(blob) if new_blob else blob
        if new_blob:
            _transfer(url, metadata, candidate, file)
        _verify_download(candidate, file)
        if new_blob:
            os.replace(candidate, blob)
        _create_symlink(str(blob), str(pointer), new_blob=new_blob)  # a copy where symlinks are unsupported
    _cache_commit_hash_for_specific_revision(str(storage), file.revision, metadata.commit_hash)
    return pointer


def _transfer(url: str, metadata: HfFileMetadata, partial: Path, file: HubFile) -> None:
    """Append to `partial` the bytes it lacks, asking for `Range: bytes=<its size>-`.

    huggingface_hub's `http_get` sends the range, starts over when the server answers 200 instead
    of 206, continues a cut connection where it stopped, and starts the progress bar at the offset.
    """
    headers = build_hf_headers()  # HF_TOKEN, read now
    headers["Accept-Encoding"] = "identity"  # offsets count bytes of the file, not of a compressed body
    if metadata.xet_file_data is None and metadata.location != url:
        # Straight to where the Hub redirected, as huggingface_hub does; Xet files go through the redirect.
        if not _is_same_or_hub_host(url, metadata.location):
            headers.pop("authorization", None)  # a signed CDN URL must not receive the token
        url = metadata.location
    partial.touch()
    with partial.open("r+b") as handle:
        offset = handle.seek(0, os.SEEK_END)
        if metadata.size is None or offset > metadata.size:  # no size to continue towards: start over
            offset = handle.seek(0)
            handle.truncate()
        if metadata.size is None or offset < metadata.size:
            http_get(
                url,
                handle,
                resume_size=offset,
                headers=headers,
                displayed_filename=file.filename,
                tqdm_class=_progress_for(file.filename),
            )
        received = handle.tell()
    if metadata.size is not None and received != metadata.size:
        partial.unlink()  # the transfer ended cleanly at another size: nothing there to continue
        raise HubError(
            f"download of {file.repo}/{file.filename} failed: the Hub announced {metadata.size} bytes and sent {received}",
            hint="pull again; finished files are kept",
        )


def _verify_download(path: Path, file: HubFile) -> None:
    """GGUF magic always, sha256 when the registry pins one; a file failing either leaves the cache."""
    problem = None
    if _read_magic(path) != GGUF_MAGIC:
        problem = "it is not a GGUF file"
    elif file.sha256 and _sha256(path) != file.sha256:
        problem = f"its sha256 is not the {file.sha256[:12]}… that models.toml gives"
    if problem:
        path.unlink(missing_ok=True)
        raise HubError(
            f"downloaded {file.repo}/{file.filename} but {problem}; it was removed from the cache",
            hint="check the registry entry (file name, revision, sha256) in models.toml",
        )


def _check_magic(path: Path, pair_name: str | None) -> None:
    if _read_magic(path) != GGUF_MAGIC:
        hint = f"run: specli rm {pair_name} && specli pull {pair_name}" if pair_name else "replace the file"
        raise ModelFileError(f"{path} is not a GGUF file", hint=hint)


def _read_magic(path: Path) -> bytes:
    with path.open("rb") as handle:
        return handle.read(len(GGUF_MAGIC))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class _Progress(tqdm):
    """Download bars on stderr (size, speed, ETA), drawn only when stderr is a terminal."""

    label = ""

    def __init__(self, *args, **kwargs):
        kwargs.pop("name", None)
        description = kwargs.get("desc") or ""
        if self.label and ("/" in description or description.startswith("(…)")):
            kwargs["desc"] = self.label  # huggingface_hub names plain HTTP downloads by their URL
        kwargs["file"] = sys.stderr
        kwargs["disable"] = not _stderr_is_tty() or constants.HF_HUB_DISABLE_PROGRESS_BARS is True
        kwargs.setdefault("dynamic_ncols", True)
        super().__init__(*args, **kwargs)


def _progress_for(filename: str) -> type[_Progress]:
    return type("_Progress", (_Progress,), {"label": filename})


def _stderr_is_tty() -> bool:
    return sys.stderr is not None and sys.stderr.isatty()


def _say(message: str) -> None:
    """A progress note on stderr, for people at a terminal only."""
    if _stderr_is_tty():
        print(message, file=sys.stderr)


@contextmanager
def _hub_errors(repo: str, filename: str, revision: str) -> Iterator[None]:
    """Turn huggingface_hub and network exceptions into one-line errors with a hint."""
    endpoint = hub_endpoint()
    login = "log in with `hf auth login` or set HF_TOKEN"
    try:
        yield
    except GatedRepoError:
        raise HubError(
            f"{repo} is gated: its terms must be accepted before download",
            hint=f"accept them at {endpoint}/{repo}, then {login}",
        ) from None
    except RepositoryNotFoundError:
        raise HubError(
            f"repository {repo} not found on {endpoint}",
            hint=f"check the repo id in models.toml; for a private repo, {login}",
        ) from None
    except RevisionNotFoundError:
        raise HubError(f"revision '{revision}' not found in {repo}", hint="check 'revision' in models.toml") from None
    except (LocalEntryNotFoundError, OfflineModeIsEnabled):
        if hub_offline():
            raise OfflineError(f"{repo}/{filename} is not in the cache and downloads are off (HF_HUB_OFFLINE)") from None
        raise HubError(f"cannot reach the Hub at {endpoint}", hint="check your network; HF_HUB_OFFLINE=1 uses cached files only") from None
    except EntryNotFoundError:
        raise HubError(f"file {filename} not found in {repo}", hint="check the file name in models.toml") from None
    except HfHubHTTPError as error:
        status = error.response.status_code if error.response is not None else None
        if status in (401, 403):
            raise HubError(f"the Hub refused access to {repo} (HTTP {status})", hint=login) from None
        raise HubError(f"the Hub answered HTTP {status} for {repo}/{filename}", hint="try again later") from None
    except httpx2.TransportError as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise HubError(
            f"cannot reach the Hub at {endpoint}: {reason}",
            hint="check your network or proxy; HF_HUB_OFFLINE=1 uses cached files only",
        ) from None
    except OSError as error:
        if error.errno == errno.ENOSPC:
            raise HubError(f"disk full while downloading {filename}", hint="free some space and pull again") from None
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise HubError(f"download of {repo}/{filename} failed: {reason}", hint="pull again: it goes on where it stopped") from None


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
    """Which of the pair's files are on disk, where, and how big; never touches the network."""
    return PairStatus(pair=pair, models=[_model_status(role, ref) for role, ref in pair.models()])


def _model_status(role: str, ref: ModelRef) -> ModelStatus:
    if ref.path is not None:
        present = ref.path.is_file()
        file = CachedFile(ref.path.name, ref.path if present else None, ref.path.stat().st_size if present else None)
        return ModelStatus(role, ref, [file], present)
    if ref.package is not None:
        return ModelStatus(role, ref, [], _package_installed(ref.package))
    files = [
        CachedFile(filename, path, path.stat().st_size if path else None)
        for filename, path in zip(ref.files, _cached_parts(ref))
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
                partials.update(dict.fromkeys(_partials(ref.repo)))
    return Removal(pair=pair, entries=[*entries, *partials], blobs=_orphaned_blobs(entries), kept=kept)


def remove_files(removal: Removal) -> list[Path]:
    """Delete the planned entries and blobs, then any repo folder left without files."""
    repos = {_repo_folder_of(entry) for entry in removal.entries}
    for path in [*removal.entries, *removal.blobs]:
        path.unlink(missing_ok=True)
    for repo in repos:
        _prune(repo)
    return removal.entries


def _downloaded_user(repo: str, filename: str, others: list[Pair]) -> Optional[str]:
    for other in others:
        uses = any(ref.repo == repo and filename in ref.files for _, ref in other.models())
        if uses and pair_status(other).downloaded:
            return other.name
    return None


def _repo_cache(repo: str) -> Path:
    return hub_cache_dir() / repo_folder_name(repo_id=repo, repo_type="model")


def _repo_folder_of(entry: Path) -> Path:
    """The `models--owner--name` folder that holds a snapshot entry or a blob."""
    cache = hub_cache_dir()
    return cache / entry.relative_to(cache).parts[0]


def _snapshot_entries(repo: str, filename: str) -> list[Path]:
    """The file in every cached revision of the repo."""
    snapshots = _repo_cache(repo) / "snapshots"
    if not snapshots.is_dir():
        return []
    return [snapshot / filename for snapshot in sorted(snapshots.iterdir()) if os.path.lexists(snapshot / filename)]


def _partials(repo: str) -> list[Path]:
    """What interrupted pulls left in the repo's blobs: `<etag>.incomplete`, not the files of a running
    `hf download` (`<etag>.<random>.incomplete`, which it deletes itself)."""
    blobs = _repo_cache(repo) / "blobs"
    return sorted(path for path in blobs.glob("*.incomplete") if path.name.count(".") == 1) if blobs.is_dir() else []


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
    (unless a running `hf download` is writing into it)."""
    snapshots = repo / "snapshots"
    for folder in sorted(snapshots.rglob("*"), key=lambda path: len(path.parts), reverse=True):
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
    downloading = any(path.name.count(".") > 1 for path in (repo / "blobs").glob("*.incomplete"))
    if not downloading and (not snapshots.is_dir() or not any(snapshots.iterdir())):
        shutil.rmtree(repo, ignore_errors=True)
        shutil.rmtree(hub_cache_dir() / ".locks" / repo.name, ignore_errors=True)
