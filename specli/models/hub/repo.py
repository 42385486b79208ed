"""A Hub repo's file list: one request for the names, sizes and LFS sha256 of every file at a revision,
and what to say when a file name is not among them.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Iterable, Optional

from huggingface_hub import HfApi

from specli.errors import HubError
from specli.models.registry import SPLIT_GGUF

# Files in GGUF repos that are not models to run: vision projectors and importance matrices,
# which llama.cpp's `-hf` also passes over.
NOT_MODELS = ("mmproj", "imatrix")
# The quant llama.cpp's `-hf owner/repo` picks when no tag is given: the first of these the repo has.
DEFAULT_QUANTS = ("Q4_K_M", "Q8_0")


@dataclass(frozen=True)
class RemoteFile:
    name: str  # the path in the repo
    size: Optional[int]
    sha256: Optional[str]  # the LFS sha256 of the content, where the Hub gives it


@dataclass(frozen=True)
class RepoFiles:
    repo: str
    commit: Optional[str]  # the commit the listing is of
    files: dict[str, RemoteFile]

    @property
    def models(self) -> list[str]:
        """The GGUF models: single files and part 1 of each split model, in the repo's order."""
        return [name for name in self.files if is_model(name) and split_index(name) in (None, 1)]


def list_repo(repo: str, revision: Optional[str], endpoint: str) -> RepoFiles:
    """The repo's files at `revision` (default: main). Raises huggingface_hub's errors."""
    info = HfApi(endpoint=endpoint).model_info(repo, revision=revision, files_metadata=True)
    files = {}
    for sibling in info.siblings or []:
        lfs = sibling.lfs
        size = sibling.size if sibling.size is not None else (lfs.size if lfs else None)
        files[sibling.rfilename] = RemoteFile(sibling.rfilename, size, lfs.sha256.lower() if lfs else None)
    return RepoFiles(repo, info.sha, files)


def is_model(name: str) -> bool:
    base = PurePosixPath(name).name.lower()
    return base.endswith(".gguf") and not any(word in base for word in NOT_MODELS)


def split_index(name: str) -> Optional[int]:
    """The part number of a split GGUF's file, None for a single file."""
    match = SPLIT_GGUF.match(PurePosixPath(name).name)
    return int(match["part"]) if match else None


def split_stem(name: str) -> str:
    """The file's path without `.gguf` and without the `-0000N-of-0000M` of a split part."""
    path = PurePosixPath(name)
    match = SPLIT_GGUF.match(path.name)
    base = match["stem"] if match else re.sub(r"(?i)\.gguf$", "", path.name)
    return str(path.with_name(base))


def missing_file(repo: str, filename: str, names: Iterable[str]) -> tuple[str, str]:
    """A one-line message and a hint for a file that is not in the repo: the split parts it is
    stored as, the nearest names, or what the repo holds."""
    listing = RepoFiles(repo, None, {name: RemoteFile(name, None, None) for name in names})
    models = listing.models
    message = f"file {filename} not found in {repo}"
    if SPLIT_GGUF.match(PurePosixPath(filename).name) is None:
        wanted = PurePosixPath(split_stem(filename)).name.lower()
        for name in models:
            match = SPLIT_GGUF.match(PurePosixPath(name).name)
            if match and match["stem"].lower() == wanted:
                return f"{message}: it is split in {int(match['count'])} parts", f"name part 1: {name}"
    close = difflib.get_close_matches(filename, models, n=3, cutoff=0.6)
    if not close:  # a file in a folder, or a folder missing: compare the names alone
        by_name = {PurePosixPath(name).name: name for name in models}
        close = [by_name[name] for name in difflib.get_close_matches(PurePosixPath(filename).name, list(by_name), n=3, cutoff=0.6)]
    if close:
        return message, f"did you mean {', '.join(close)}?"
    if not models:
        return message, "the repo holds no GGUF model"
    shown = ", ".join(models[:4]) + (", …" if len(models) > 4 else "")
    return message, f"it holds {len(models)} GGUF model(s): {shown}"


def choose_model(repo: str, names: Iterable[str], quant: Optional[str]) -> str:
    """The file `repo:QUANT` names, as llama.cpp's `-hf` reads it: the model whose name holds the quant
    tag (any case) before its `.gguf` or its part number; without a tag, Q4_K_M, else Q8_0, else the
    repo's only model. A split model is named by part 1; where a quant is stored both whole and split,
    the whole file. Raises HubError, listing what the repo has, when none or several models match."""
    models = [name for name in names if is_model(name) and split_index(name) in (None, 1)]
    if not models:
        raise HubError(f"{repo} holds no GGUF model", hint="name a repo of GGUF files, such as one ending in -GGUF")
    for wanted in [quant] if quant else DEFAULT_QUANTS:
        found = [name for name in models if _holds_quant(name, wanted)]
        stems = dict.fromkeys(PurePosixPath(split_stem(name)).name for name in found)
        if len(stems) == 1:
            whole = [name for name in found if split_index(name) is None]
            return (whole or found)[0]
        if len(stems) > 1:
            raise HubError(f"{repo}:{wanted} matches {len(stems)} models: {', '.join(found)}",
                           hint=f"name the file instead, as {repo}/{found[0]}")
    if quant is None and len(models) == 1:
        return models[0]
    tags = list(dict.fromkeys(quant_tag(name) for name in models))
    missing = f"{repo} has no {quant} model" if quant else f"{repo} has no {' or '.join(DEFAULT_QUANTS)} model"
    raise HubError(f"{missing}; it has {', '.join(tags)}", hint=f"name one after a colon, as {repo}:{tags[0]}")


def quant_tag(name: str) -> str:
    """`Q4_K_M` for `Model-Q4_K_M.gguf` or `Model-q4_k_m-00001-of-00002.gguf`: the last word of the
    name, as llama.cpp reads it; the file name when there is none."""
    match = re.search(r"[-.]([A-Za-z0-9_]+)$", PurePosixPath(split_stem(name)).name)
    return match[1].upper() if match else PurePosixPath(name).name


def _holds_quant(name: str, quant: str) -> bool:
    return re.search(rf"(?:^|[-._/]){re.escape(quant)}[.-]", name, re.IGNORECASE) is not None
