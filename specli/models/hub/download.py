"""Model files from the Hugging Face Hub: resolve a pair to local paths, plan a pull, pull.

huggingface_hub's `hf_hub_download` does the transfer and lays the file out in the cache as `hf download`
does: blob lock, `blobs/`, `snapshots/`, `refs/`, hf_xet for Xet-backed repos, and a connection cut
during a pull continued from where it stopped. A killed pull is not continued (huggingface_hub starts
every download in a new file); the next pull deletes what it left. specli adds the plan, the disk-space
check, the registry's pins (the revision to fetch, each file's or part's size before the download and its
sha256 after), the GGUF check and its errors. `HF_ENDPOINT`, `HF_TOKEN`, `HF_HUB_CACHE`/`HF_HOME` and
`HF_HUB_OFFLINE` are read when a function runs, not when huggingface_hub is imported.
"""

from __future__ import annotations

import errno
import hashlib
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Iterator, Optional

import httpx2
from huggingface_hub import constants, get_hf_file_metadata, hf_hub_download, hf_hub_url, try_to_load_from_cache
from huggingface_hub.errors import (
    EntryNotFoundError,
    FileMetadataError,
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from tqdm import tqdm

from specli.errors import HubError, ModelFileError, OfflineError
from specli.llama.gguf_header import GGUF_MAGIC
from specli.models.hub.cache import (
    cached_parts,
    discard_stale_partials,
    format_size,
    free_space,
    hub_cache_dir,
    pair_status,
    remove_entry,
    repo_cache,
)
from specli.models.hub.repo import list_repo, missing_file
from specli.models.registry import ModelRef, Pair


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", constants.ENDPOINT).rstrip("/")


def hub_offline() -> bool:
    return constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"}


# --- resolving: a local path for each model of a pair -------------------------------------------


def resolve_pair(pair: Pair, *, download: bool = True) -> tuple[Path, Path | None]:
    """Local paths of the target and the draft model (None: the pair drafts without one, by
    n-gram lookup or with the target's NextN layers), pulling missing files when allowed."""
    if download and not hub_offline() and not pair_status(pair).downloaded:
        return pull_pair(pair)
    target = resolve_model(pair.target, download=False, pair_name=pair.name)
    if not isinstance(pair.draft, ModelRef):
        return target, None
    return target, resolve_model(pair.draft, download=False, pair_name=pair.name)


def resolve_model(ref: ModelRef, *, download: bool = True, pair_name: str | None = None) -> Path:
    """The local file of one model (part 1 of a split GGUF); downloads it when missing and allowed."""
    if ref.path is not None:
        return _checked_local(ref.path)
    if ref.package is not None:
        from specli.models.demo import embedded_model_path

        return embedded_model_path()
    cached = cached_parts(ref)
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
    files = _plan_model("model", ref, pair_name)
    _make_room(files, pair_name or ref.label)
    needed = sum(file.fetch_size for file in files)
    if needed:
        _say(f"pulling {pair_name or ref.label}: {format_size(needed)} to download")
    return _fetch(files, pair_name)[0]


def _checked_local(path: Path) -> Path:
    if not path.is_file():
        raise ModelFileError(f"model file not found: {path}", hint="check 'path' in models.toml")
    _check_magic(path, None)
    return path


# --- planning: what a pull would fetch ----------------------------------------------------------


@dataclass(frozen=True)
class HubFile:
    """One file of a model in a Hub repo, and where it stands in the local cache."""

    role: str
    repo: str
    filename: str
    revision: str  # as the registry asks for it: a branch, tag or commit (default "main")
    size: Optional[int]  # as the Hub (or, offline, the cache) reports it
    cached: Optional[Path]  # the snapshot entry, when this revision of the file is in the cache
    sha256: Optional[str] = None  # the registry's pin of the content, checked after download
    in_blobs: bool = False  # same content already cached under another revision: nothing to fetch

    @property
    def fetch_size(self) -> int:
        """Bytes a pull still transfers for this file (0 when unknown)."""
        return 0 if self.cached or self.in_blobs else self.size or 0


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
        commit = metadata.commit_hash or commit  # later parts are planned at the first one's commit
        _check_declared_size(ref, filename, metadata.size, commit, pair_name)
        cached = try_to_load_from_cache(ref.repo, filename, cache_dir=hub_cache_dir(), revision=commit)
        in_blobs = metadata.etag is not None and (repo_cache(ref.repo) / "blobs" / metadata.etag).is_file()
        cached = Path(cached) if isinstance(cached, str) else None
        sha256 = ref.file_sha256(filename)
        planned.append(HubFile(role, ref.repo, filename, revision, metadata.size, cached, sha256, in_blobs))
    return planned


def _check_declared_size(ref: ModelRef, filename: str, size: Optional[int], commit: str, pair_name: str | None) -> None:
    """The declared size against the Hub's, before a byte is fetched: a mismatch means the pin is wrong."""
    declared = ref.file_size(filename)
    if declared is not None and size is not None and size != declared:
        source, hint = _pins_source(pair_name, "'size' and 'revision'")
        raise HubError(
            f"{ref.repo}/{filename} is {size} bytes on the Hub at {commit[:12]}, not the {declared} that {source} "
            "gives; nothing was downloaded",
            hint=hint,
        )


def _pins_source(pair_name: str | None, keys: str) -> tuple[str, str]:
    """Where a model's pins come from, and what to do when the Hub disagrees: a pair's from models.toml;
    a Hub reference's from the repo's file list, read just before."""
    if pair_name:
        return "models.toml", f"check {keys} in models.toml"
    return "the repo's file list", "the repo changed while specli read it; run again"


def _plan_offline(role: str, ref: ModelRef, pair_name: str | None) -> list[HubFile]:
    planned = []
    for filename, cached in zip(ref.files, cached_parts(ref)):
        if cached is None:
            raise OfflineError(
                f"{ref.repo}/{filename} is not in the cache and downloads are off (HF_HUB_OFFLINE)",
                hint=f"unset HF_HUB_OFFLINE and run: specli pull {pair_name or ref.repo}",
            )
        size = cached.stat().st_size
        planned.append(HubFile(role, ref.repo, filename, ref.revision or "main", size, cached, ref.file_sha256(filename)))
    return planned


def check_disk_space(files: list[HubFile], what: str) -> None:
    """Refuse to start a download that cannot fit, when the Hub told us the sizes."""
    needed = sum(file.fetch_size for file in files)
    cache = hub_cache_dir()
    free = free_space(cache) if needed else None
    if free is not None and needed > free:
        raise HubError(
            f"not enough disk space for {what}: {format_size(needed)} to download, {format_size(free)} free in {cache}",
            hint="free some space, or point HF_HOME (or HF_HUB_CACHE) at a disk with room",
        )


def _make_room(files: list[HubFile], what: str) -> None:
    """Delete what killed downloads left in the repos about to be pulled, then check the space."""
    freed = discard_stale_partials({file.repo for file in files if not (file.cached or file.in_blobs)})
    if freed:
        _say(f"removed {format_size(freed)} left by an interrupted download")
    check_disk_space(files, what)


# --- pulling ------------------------------------------------------------------------------------


def pull_pair(pair: Pair, plan: PullPlan | None = None) -> tuple[Path, Path | None]:
    """Download whatever the pair lacks, verify it, and return the target's and the draft
    model's paths (None: the pair drafts with n-gram lookup)."""
    plan = plan or plan_pull(pair)
    _make_room(plan.files, pair.name)
    if plan.download_size:
        _say(f"pulling {pair.name}: {format_size(plan.download_size)} to download")
    target = _pulled_model("target", pair.target, plan, pair.name)
    if pair.projector is not None:
        _pulled_model("projector", pair.projector, plan, pair.name)
    if not isinstance(pair.draft, ModelRef):
        return target, None
    return target, _pulled_model("draft", pair.draft, plan, pair.name)


def _pulled_model(role: str, ref: ModelRef, plan: PullPlan, pair_name: str) -> Path:
    if ref.repo is None:
        return resolve_model(ref, pair_name=pair_name)
    return _fetch([file for file in plan.files if file.role == role], pair_name)[0]


def _fetch(files: list[HubFile], pair_name: str | None) -> list[Path]:
    """The snapshot entry of each file of one model, downloading the files that are not cached.

    The first file is fetched at the registry's revision, which records the branch in `refs/`; every
    other part comes from the commit that file resolved to, so the parts of a split GGUF match.
    """
    paths: list[Path] = []
    commit: str | None = None
    for file in files:
        cached = file.cached
        if cached is not None and commit is not None and _commit_of(cached, file.filename) != commit:
            cached = None  # the first part was fetched at a newer commit than the plan saw
        if cached is not None:
            _check_magic(cached, pair_name)
            path = cached
        else:
            with _hub_errors(file.repo, file.filename, file.revision):
                path = _download(file, commit or file.revision, pair_name)
        commit = commit or _commit_of(path, file.filename)
        paths.append(path)
    return paths


def _commit_of(entry: Path, filename: str) -> str:
    """The commit of a snapshot entry: `snapshots/<commit>/<filename>`."""
    return entry.parents[len(PurePosixPath(filename).parts) - 1].name


def _download(file: HubFile, revision: str, pair_name: str | None) -> Path:
    """huggingface_hub puts the file in the cache; specli checks it before anyone loads it."""
    path = hf_hub_download(
        file.repo,
        file.filename,
        revision=revision,
        cache_dir=hub_cache_dir(),
        endpoint=hub_endpoint(),
        tqdm_class=_progress_for(file.filename),
    )
    cache = hub_cache_dir()
    entry = cache / Path(path).relative_to(cache.resolve())  # it resolves the cache folder; specli shows it as given
    _verify_download(entry, file, pair_name)
    return entry


def _verify_download(entry: Path, file: HubFile, pair_name: str | None) -> None:
    """GGUF magic always, sha256 when it is pinned; a file failing either leaves the snapshot."""
    problem = None
    source, hint = _pins_source(pair_name, "the entry (file name, revision, sha256)")
    if _read_magic(entry) != GGUF_MAGIC:
        problem = "it is not a GGUF file"
    elif file.sha256 and _sha256(entry) != file.sha256:
        problem = f"its sha256 is not the {file.sha256[:12]}… that {source} gives"
    if problem:
        remove_entry(entry)
        raise HubError(f"downloaded {file.repo}/{file.filename} but {problem}; it was removed from the cache", hint=hint)


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


# --- progress and errors ------------------------------------------------------------------------


class _Progress(tqdm):
    """Download bars on stderr (size, speed, ETA), drawn only when stderr is a terminal."""

    label = ""

    def __init__(self, *args, **kwargs):
        kwargs.pop("name", None)
        description = kwargs.get("desc") or ""
        if self.label and description.startswith(("(…)", "http://", "https://")):
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
            hint=f"check the repo id; for a private repo, {login}",
        ) from None
    except RevisionNotFoundError:
        raise HubError(f"revision '{revision}' not found in {repo}", hint="check 'revision' in models.toml") from None
    except (LocalEntryNotFoundError, OfflineModeIsEnabled) as error:
        if hub_offline():
            raise OfflineError(f"{repo}/{filename} is not in the cache and downloads are off (HF_HUB_OFFLINE)") from None
        if isinstance(error.__cause__, FileMetadataError):  # an answer without the Hub's headers
            raise HubError(
                f"{endpoint} sent {repo}/{filename} without a commit or an etag",
                hint="check that HF_ENDPOINT points to a Hugging Face Hub or a mirror of one",
            ) from None
        raise HubError(f"cannot reach the Hub at {endpoint}", hint="check your network; HF_HUB_OFFLINE=1 uses cached files only") from None
    except EntryNotFoundError:
        message, hint = _explain_missing(repo, filename, revision)
        raise HubError(message, hint=hint) from None
    except HfHubHTTPError as error:
        status = error.response.status_code if error.response is not None else None
        if status in (401, 403):
            raise HubError(f"the Hub refused access to {repo} (HTTP {status})", hint=login) from None
        what = f"{repo}/{filename}" if filename else repo
        raise HubError(f"the Hub answered HTTP {status} for {what}", hint="try again later") from None
    except httpx2.TransportError as error:  # huggingface_hub's transport, raised as is once its retries give up
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise HubError(
            f"cannot reach the Hub at {endpoint}: {reason}",
            hint="check your network or proxy; HF_HUB_OFFLINE=1 uses cached files only",
        ) from None
    except OSError as error:
        if error.errno == errno.ENOSPC:
            raise HubError(f"disk full while downloading {filename}", hint="free some space and pull again") from None
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise HubError(f"download of {repo}/{filename} failed: {reason}", hint="pull again") from None


def _explain_missing(repo: str, filename: str, revision: str) -> tuple[str, str]:
    """What the repo holds instead of a missing file, when its file list can be had."""
    try:
        names = list_repo(repo, revision, hub_endpoint()).files
    except (HfHubHTTPError, httpx2.TransportError, OSError):
        return f"file {filename} not found in {repo}", "check the file name in models.toml"
    return missing_file(repo, filename, names)
