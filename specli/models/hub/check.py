"""`specli list --check`: every Hub file of every pair against the Hub's own file list, downloading nothing.

A file passes when it is in the repo at the registry's revision, has the size the registry declares and,
where the Hub gives the file's LFS sha256, the sha256 the registry pins. One request per repo and revision.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional, Union

from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

from specli.errors import OfflineError
from specli.models.hub.download import _hub_errors, hub_endpoint, hub_offline
from specli.models.hub.repo import RepoFiles, list_repo, missing_file
from specli.models.registry import ModelRef, Pair


@dataclass
class CheckReport:
    endpoint: str
    pairs: int = 0  # pairs with a model on the Hub
    files: int = 0  # distinct files checked
    problems: list[str] = field(default_factory=list)  # one line each


def check_pairs(pairs: Iterable[Pair]) -> CheckReport:
    if hub_offline():
        raise OfflineError("list --check asks the Hub, and HF_HUB_OFFLINE is set", hint="unset HF_HUB_OFFLINE")
    report = CheckReport(hub_endpoint())
    models: dict[str, tuple[ModelRef, list[str]]] = {}  # a model shared by pairs is checked once
    for pair in pairs:
        hub_models = [(role, ref) for role, ref in pair.models() if ref.repo]
        report.pairs += bool(hub_models)
        for role, ref in hub_models:
            models.setdefault(ref.model_dump_json(), (ref, []))[1].append(f"{pair.name} {role}")
    listings: dict[tuple[str, Optional[str]], Union[RepoFiles, str]] = {}
    for ref, names in models.values():
        key = (ref.repo, ref.revision)
        if key not in listings:
            listings[key] = _files_or_problem(ref.repo, ref.revision)
        report.files += len(ref.files)
        for problem in _check_model(ref, listings[key]):
            report.problems.append(f"{', '.join(names)}: {problem}")
    return report


def _files_or_problem(repo: str, revision: Optional[str]) -> Union[RepoFiles, str]:
    """The repo's files at the revision, or the problem that stops the check of its files.
    A Hub that cannot be reached stops the whole check (HubError)."""
    with _hub_errors(repo, "", revision or "main"):
        try:
            return list_repo(repo, revision, hub_endpoint())
        except GatedRepoError:
            return f"{repo} is gated: its files need an accepted licence and a token"
        except RepositoryNotFoundError:
            return f"repository {repo} not found"
        except RevisionNotFoundError:
            return f"revision {revision} not found in {repo}"


def _check_model(ref: ModelRef, listing: Union[RepoFiles, str]) -> list[str]:
    if isinstance(listing, str):
        return [listing]
    problems = []
    for filename in ref.files:
        where = f"{ref.repo}/{filename}"
        remote = listing.files.get(filename)
        if remote is None:
            message, hint = missing_file(ref.repo, filename, listing.files)
            problems.append(f"{message} ({hint})")
            continue
        declared_size, declared_sha256 = ref.file_size(filename), ref.file_sha256(filename)
        if declared_size is not None and remote.size is not None and remote.size != declared_size:
            problems.append(f"{where} is {remote.size} bytes on the Hub, not the declared {declared_size}")
        if declared_sha256 and remote.sha256 and remote.sha256 != declared_sha256:
            problems.append(f"{where} has sha256 {remote.sha256[:12]}… on the Hub, not the pinned {declared_sha256[:12]}…")
    return problems
