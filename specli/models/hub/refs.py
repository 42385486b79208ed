"""Hub references where a model file goes (`--target`, `--draft`), in llama.cpp's `-hf` spelling:
`owner/repo:QUANT` (or `owner/repo` for its default quant) and `owner/repo/path/file.gguf`.

A reference is resolved against the repo's file list and pulled into the Hugging Face cache like a
pair's files: the same plan, disk check, progress, continued transfers and checks, with the size and
sha256 the Hub lists for each file as the pins. A reference already in the cache needs no network.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import httpx2
from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

from specli.errors import HubError, ModelFileError
from specli.models.hub.cache import cached_parts, cached_repo_files
from specli.models.hub.download import _hub_errors, hub_endpoint, hub_offline, resolve_model
from specli.models.hub.repo import RepoFiles, choose_model, list_repo, missing_file
from specli.models.registry import ModelRef, Part, split_parts

_REPO = r"[A-Za-z0-9][\w.-]*/[\w.-]+"
_FILE_REFERENCE = re.compile(rf"^(?P<repo>{_REPO})/(?P<file>[^:]+\.gguf)$", re.IGNORECASE)
_QUANT_REFERENCE = re.compile(rf"^(?P<repo>{_REPO})(?::(?P<quant>[\w.-]+))?$")


@dataclass(frozen=True)
class HubReference:
    repo: str
    file: Optional[str] = None  # `owner/repo/file.gguf`
    quant: Optional[str] = None  # `owner/repo:QUANT`; neither: the repo's default quant


def parse_reference(text: str) -> Optional[HubReference]:
    """The Hub reading of a model argument, or None where it can only be a local path."""
    match = _FILE_REFERENCE.match(text)
    if match:  # any part of a split model names the model, by its part 1
        return HubReference(match["repo"], file=split_parts(match["file"])[0])
    match = _QUANT_REFERENCE.match(text)
    if match and not match["repo"].lower().endswith(".gguf"):  # `models/x.gguf` is a file
        return HubReference(match["repo"], quant=match["quant"])
    return None


def resolve_reference(text: str) -> Optional[Path]:
    """The local file of a Hub reference (part 1 of a split model), pulled when missing; None when
    `text` is not a Hub reference. A caller checks first that no local file has this name."""
    reference = parse_reference(text)
    if reference is None:
        return None
    cached = _from_cache(reference)
    if cached is not None:
        return cached
    if hub_offline():
        if reference.file:
            raise ModelFileError(f"model file not found: {text}", hint="nor in the Hugging Face cache (HF_HUB_OFFLINE is set)")
        raise HubError(f"{text} is not in the Hugging Face cache and downloads are off (HF_HUB_OFFLINE)",
                       hint="unset HF_HUB_OFFLINE to download it")
    listing = _reference_files(reference, text)
    if reference.file is None:
        filename = choose_model(reference.repo, listing.files, reference.quant)
    elif reference.file in listing.files:
        filename = reference.file
    else:
        message, hint = missing_file(reference.repo, reference.file, listing.files)
        raise HubError(message, hint=hint)
    return resolve_model(_model_ref(reference.repo, filename, listing), download=True)


def projector_for(text: str) -> Optional[Path]:
    """The image projector in a Hub reference's repo (its mmproj GGUF, which llama.cpp's `-hf`
    fetches beside the model), pulled when missing; None where the repo has none, downloads are
    off and it is not cached, or `text` is no Hub reference."""
    reference = parse_reference(text)
    if reference is None:
        return None
    cached = _projector_name(cached_repo_files(reference.repo), reference.quant)
    if cached is not None and all(cached_parts(ModelRef(repo=reference.repo, file=cached))):
        return resolve_model(ModelRef(repo=reference.repo, file=cached), download=False)
    if hub_offline():
        return None
    listing = _reference_files(reference, text)
    found = _projector_name(listing.files, reference.quant)
    return resolve_model(_model_ref(reference.repo, found, listing), download=True) if found else None


def _projector_name(names, quant: Optional[str]) -> Optional[str]:
    """The repo's projector: the mmproj GGUF whose name holds the quant tag, else an F16 one, else the first."""
    found = sorted(name for name in names if "mmproj" in name.lower() and name.lower().endswith(".gguf"))
    for tag in ([quant] if quant else []) + ["f16"]:
        matching = [name for name in found if tag.lower() in name.lower()]
        if matching:
            return matching[0]
    return found[0] if found else None


def cached_reference(text: str) -> Optional[Path]:
    """The local file of a Hub reference where the cache holds it (nothing is downloaded);
    None where it does not, or `text` is not a Hub reference."""
    reference = parse_reference(text)
    return _from_cache(reference) if reference is not None else None


def _from_cache(reference: HubReference) -> Optional[Path]:
    """The model from the cached snapshot of `main`, when all its files are there."""
    names = cached_repo_files(reference.repo)
    if not names:
        return None
    if reference.file is None:
        try:
            filename = choose_model(reference.repo, names, reference.quant)
        except HubError:
            return None
    else:
        filename = reference.file
    ref = ModelRef(repo=reference.repo, file=filename)
    if not all(cached_parts(ref)):
        return None
    return resolve_model(ref, download=False)


def _reference_files(reference: HubReference, text: str) -> RepoFiles:
    """The repo's files. `owner/repo/file.gguf` reads as a local path as well: where there is no such
    repo, or no Hub to ask, the error is about the missing file."""
    endpoint = hub_endpoint()
    with _hub_errors(reference.repo, reference.file or "", "main"):
        try:
            return list_repo(reference.repo, None, endpoint)
        except GatedRepoError:
            raise
        except (RepositoryNotFoundError, httpx2.TransportError) as error:
            if reference.file is None:
                raise
            reason = "there is no such repo" if isinstance(error, RepositoryNotFoundError) else "it cannot be reached"
            raise ModelFileError(f"model file not found: {text}",
                                 hint=f"nor on the Hub at {endpoint}: {reason}") from None


def _model_ref(repo: str, filename: str, listing: RepoFiles) -> ModelRef:
    """The model's files, pinned by the size and sha256 the Hub lists for each."""
    remote = [listing.files.get(name) for name in split_parts(filename)]
    if None in remote:
        missing = split_parts(filename)[remote.index(None)]
        raise HubError(f"{repo} lacks {missing}, a part of {filename}", hint="the repo is incomplete; pick another quant")
    if len(remote) == 1:
        return ModelRef(repo=repo, file=filename, sha256=remote[0].sha256, size=remote[0].size)
    known = all(file.sha256 or file.size for file in remote)
    parts = [Part(sha256=file.sha256, size=file.size) for file in remote] if known else None
    return ModelRef(repo=repo, file=filename, parts=parts)
