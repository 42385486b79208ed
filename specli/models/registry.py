"""The pair registry: `models.toml` (shipped) merged with the user's own, validated by pydantic.

This is the only module that parses `models.toml`. A pair names a target model and the draft
that proposes tokens for it; each model comes from the Hugging Face Hub (`repo` + `file`),
a local `path`, or a Python `package` that ships it. A draft model normally shares the target's
vocabulary; a pair whose draft has one of its own says so with `cross_vocabulary = true`, and
that draft proposes through text. A pair may draft without a second model: by n-gram lookup
(`draft = "ngram"`), or with the target's own NextN layers (`draft = "mtp"`).
"""

from __future__ import annotations

import difflib
import re
import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Optional, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StringConstraints,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from specli.config import specli_home
from specli.decode.request import DraftKind
from specli.errors import ConfigError, UnknownPairError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

REGISTRY_FILE = "models.toml"

# `name-00001-of-00003.gguf`, the naming llama.cpp's gguf-split gives the parts of a split model.
SPLIT_GGUF = re.compile(r"^(?P<stem>.+)-(?P<part>\d{5})-of-(?P<count>\d{5})\.gguf$")
SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
# A Hub revision is a commit (40 hex digits: a pin) or a branch or tag name (which can move).
COMMIT_HEX = re.compile(r"^[0-9a-f]{40}$")
REF_NAME = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_./-]*$")
PAIR_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def split_parts(filename: str) -> list[str]:
    """All files of a model: the file itself, or every part when it is part 1 of a split GGUF."""
    match = SPLIT_GGUF.match(filename)
    if not match:
        return [filename]
    count = int(match["count"])
    return [f"{match['stem']}-{part:05d}-of-{count:05d}.gguf" for part in range(1, count + 1)]


def _sha256_hex(value: Optional[str]) -> Optional[str]:
    if value is not None and not SHA256_HEX.match(value.lower()):
        raise ValueError("must be 64 hexadecimal digits")
    return value.lower() if value else value


class Part(BaseModel):
    """The pin of one part of a split GGUF: its sha256 and its size in bytes, as a public source states them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sha256: Optional[str] = None
    size: Optional[int] = Field(default=None, ge=1)

    @field_validator("sha256")
    @classmethod
    def _sha256(cls, value: Optional[str]) -> Optional[str]:
        return _sha256_hex(value)

    @model_validator(mode="after")
    def _not_empty(self) -> Part:
        if self.sha256 is None and self.size is None:
            raise ValueError("a part gives 'sha256', 'size' or both")
        return self


class ModelRef(BaseModel):
    """Where one model file comes from: exactly one of `repo` + `file`, `path`, or `package`.

    A Hub model may be pinned: `revision` a commit, and the content of each file by its sha256
    (`sha256` for one file, one entry of `parts` per part of a split GGUF). `size` (or each part's
    `size`) is the download in bytes. `unpinned` says why a Hub model is not fully pinned.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    repo: Optional[str] = None
    file: Optional[str] = None
    revision: Optional[str] = None
    sha256: Optional[str] = None
    size: Optional[int] = Field(default=None, ge=1)
    parts: Optional[list[Part]] = None
    unpinned: Optional[str] = None
    path: Optional[Path] = None
    package: Optional[str] = None

    @field_validator("repo")
    @classmethod
    def _repo_id(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and not re.fullmatch(r"[\w.-]+/[\w.-]+", value):
            raise ValueError(f"{value!r} is not a Hub repo id like 'owner/name'")
        return value

    @field_validator("file")
    @classmethod
    def _gguf_file(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and not value.endswith(".gguf"):
            raise ValueError(f"{value!r} is not a .gguf file")
        if value is not None and SPLIT_GGUF.match(value) and not SPLIT_GGUF.match(value)["part"] == "00001":
            raise ValueError(f"{value!r} is not the first part of a split GGUF (name part 00001 instead)")
        return value

    @field_validator("revision")
    @classmethod
    def _revision(cls, value: Optional[str]) -> Optional[str]:
        if value is None:
            return None
        if COMMIT_HEX.match(value.lower()):
            return value.lower()
        if not REF_NAME.match(value) or ".." in value:
            raise ValueError(f"{value!r} is neither a commit (40 hexadecimal digits) nor a branch or tag name")
        return value

    @field_validator("sha256")
    @classmethod
    def _sha256(cls, value: Optional[str]) -> Optional[str]:
        return _sha256_hex(value)

    @field_validator("unpinned")
    @classmethod
    def _reason(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and not value.strip():
            raise ValueError("give the reason the model is not pinned")
        return value

    @field_validator("path")
    @classmethod
    def _relative_to_registry(cls, value: Optional[Path], info: ValidationInfo) -> Optional[Path]:
        if value is None:
            return None
        value = value.expanduser()
        base = (info.context or {}).get("base_dir")
        return value if value.is_absolute() or base is None else base / value

    @model_validator(mode="after")
    def _one_source(self) -> ModelRef:
        if (self.repo is None) != (self.file is None):
            raise ValueError("'repo' and 'file' go together")
        sources = [name for name, given in (("repo", self.repo), ("path", self.path), ("package", self.package)) if given]
        if len(sources) != 1:
            raise ValueError("give exactly one source: 'repo' + 'file', 'path', or 'package'")
        hub_only = [key for key in ("revision", "sha256", "size", "parts", "unpinned") if getattr(self, key) is not None]
        if self.repo is None and hub_only:
            verb = "applies" if len(hub_only) == 1 else "apply"
            raise ValueError(f"{', '.join(repr(key) for key in hub_only)} {verb} to 'repo' + 'file' models only")
        if self.repo is None:
            return self
        count = len(self.files)
        if count > 1:
            if self.sha256 is not None or self.size is not None:
                raise ValueError(f"a split GGUF gives 'sha256' and 'size' per part, in 'parts' ({count} entries)")
            if self.parts is not None and len(self.parts) != count:
                raise ValueError(f"'parts' has {len(self.parts)} entries for a split GGUF of {count} parts")
        elif self.parts is not None:
            raise ValueError("'parts' is for a split GGUF (a file named ...-00001-of-0000N.gguf)")
        if self.unpinned is not None and self.pinned:
            raise ValueError("'unpinned' gives a reason, but the revision is a commit and every file has a sha256")
        return self

    @property
    def files(self) -> list[str]:
        """Files to fetch from `repo`: one, or every part of a split GGUF."""
        return split_parts(self.file) if self.file else []

    @property
    def revision_is_commit(self) -> bool:
        return self.revision is not None and COMMIT_HEX.match(self.revision) is not None

    def file_sha256(self, filename: str) -> Optional[str]:
        """The sha256 the registry gives for one of `files`, if any."""
        if self.parts is not None:
            return self.parts[self.files.index(filename)].sha256
        return self.sha256 if filename == self.file else None

    def file_size(self, filename: str) -> Optional[int]:
        """The size in bytes the registry gives for one of `files`, if any."""
        if self.parts is not None:
            return self.parts[self.files.index(filename)].size
        return self.size if filename == self.file else None

    @property
    def pinned(self) -> bool:
        """The revision is a commit and every file has a sha256: the bytes cannot change under the name."""
        return self.revision_is_commit and all(self.file_sha256(name) for name in self.files)

    @property
    def download_size(self) -> Optional[int]:
        """Bytes of all the model's files, when the registry gives the size of each."""
        sizes = [self.file_size(name) for name in self.files]
        return sum(sizes) if sizes and all(size is not None for size in sizes) else None

    @property
    def label(self) -> str:
        """A short human name: `repo/file`, the local path, or the package."""
        if self.repo:
            return f"{self.repo}/{self.file}"
        return str(self.path) if self.path else f"package {self.package}"


def _draft_kind(value: Any) -> str:
    return "kind" if isinstance(value, str) else "model"


# A draft model, or a draft kind that needs none by name ("ngram", "mtp"): specli/drafts.py
# holds the kinds, and says which names one when the pair is used.
DraftRef = Annotated[
    Union[Annotated[ModelRef, Tag("model")],
          Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_-]*$"), Tag("kind")]],
    Discriminator(_draft_kind),
]


class Pair(BaseModel):
    """A target model and the draft that proposes tokens for it.

    `cross_vocabulary` declares that the draft model has a vocabulary of its own: it reads the
    text re-tokenized with its tokenizer and its proposals are tokenized again for the target
    (drafting through text). It describes the pair for `specli list`; whether a draft drafts
    through text is still decided from the two files, by the vocabulary rule, when they load.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str = ""
    target: ModelRef
    draft: DraftRef
    draft_tokens: Optional[int] = Field(default=None, ge=1)
    cross_vocabulary: bool = Field(default=False, strict=True)
    projector: Optional[ModelRef] = None  # the target's image projector (an mmproj GGUF), pulled with it

    @field_validator("cross_vocabulary")
    @classmethod
    def _draft_model(cls, value: bool, info: ValidationInfo) -> bool:
        # `draft` is declared above, so it is validated first; absent here when it failed.
        if value and not isinstance(info.data.get("draft"), ModelRef):  # n-gram lookup, or the NextN layers
            raise ValueError("applies to a draft model only; n-gram lookup and MTP draft the target's own tokens")
        return value

    @property
    def draft_kind(self) -> str:
        """Who drafts, by draft kind: "model" (the draft model), or the kind the pair names."""
        return self.draft if isinstance(self.draft, str) else DraftKind.MODEL

    def models(self) -> list[tuple[str, ModelRef]]:
        """The pair's model files by role: `target`, then `draft` where the draft is a model,
        then `projector` where the pair has one."""
        roles = [("target", self.target)]
        if isinstance(self.draft, ModelRef):
            roles.append(("draft", self.draft))
        if self.projector is not None:
            roles.append(("projector", self.projector))
        return roles

    @property
    def download_size(self) -> Optional[int]:
        """Bytes to download from the Hub for the pair, when the registry gives every Hub file's size."""
        hub = [ref for _, ref in self.models() if ref.repo]
        sizes = [ref.download_size for ref in hub]
        return sum(sizes) if hub and all(size is not None for size in sizes) else None


class _PairsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pairs: dict[str, Pair] = {}


@dataclass
class Registry:
    """Every known pair by name, with the files they were read from."""

    pairs: dict[str, Pair]
    sources: list[Path] = field(default_factory=list)

    def get(self, name: str) -> Pair:
        if name in self.pairs:
            return self.pairs[name]
        close = difflib.get_close_matches(name, list(self.pairs), n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise UnknownPairError(f"unknown pair '{name}'", hint=f"{hint}run `specli list` to see every pair")


def shipped_registry_file() -> Path:
    """`models.toml` packaged with specli, or at the top of a source checkout."""
    packaged = resources.files("specli").joinpath(REGISTRY_FILE)
    if packaged.is_file():
        return Path(str(packaged))
    return Path(__file__).resolve().parents[2] / REGISTRY_FILE


def user_registry_file() -> Path:
    return specli_home() / REGISTRY_FILE


def load_registry(user_file: Path | None = None) -> Registry:
    """Shipped pairs, then the user's `models.toml` (default `$SPECLI_HOME/models.toml`) over them."""
    shipped = shipped_registry_file()
    user = user_file if user_file is not None else user_registry_file()
    pairs = read_pairs(shipped, label=REGISTRY_FILE)
    sources = [shipped]
    if user.is_file():
        pairs.update(read_pairs(user, label=str(user)))
        sources.append(user)
    elif user_file is not None:
        raise ConfigError(f"{user}: no such file")
    return Registry(pairs=pairs, sources=sources)


def read_pairs(path: Path, *, label: str | None = None) -> dict[str, Pair]:
    """Parse and validate one registry file; errors name the file, the pair and the key."""
    label = label or str(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{label}: not valid TOML: {error}") from None
    except OSError as error:
        raise ConfigError(f"{label}: cannot read: {error.strerror}") from None
    pairs = data.get("pairs", {})
    if not isinstance(pairs, dict) or any(not isinstance(table, dict) for table in pairs.values()):
        raise ConfigError(f"{label}: pairs: expected tables like [pairs.NAME]")
    tables = _pair_tables(pairs)
    for name, table in tables.items():
        if not PAIR_NAME.match(name):
            raise ConfigError(f"{label}: pairs.{name}: a pair name uses letters, digits, '.', '-' and '_'")
        if "name" in table:
            raise ConfigError(f"{label}: pairs.{name}.name: unknown key (the table name is the pair name)")
    document = {key: value for key, value in data.items() if key != "pairs"}
    document["pairs"] = {name: {**table, "name": name} for name, table in tables.items()}
    try:
        return _PairsFile.model_validate(document, context={"base_dir": path.parent}).pairs
    except ValidationError as error:
        raise ConfigError(_validation_message(error, label), hint="see the pair format at the top of the shipped models.toml") from None


# A table is a pair when it holds one of these keys; other sub-tables are pairs whose names contain dots.
_PAIR_KEYS = frozenset(Pair.model_fields) - {"name"}


def _pair_tables(node: dict[str, Any], prefix: str = "") -> dict[str, dict[str, Any]]:
    """Undo TOML's dotted keys: `[pairs.qwen2.5-coder-7b]` nests as `qwen2` -> `5-coder-7b`."""
    own: dict[str, Any] = {}
    found: dict[str, dict[str, Any]] = {}
    for key, value in node.items():
        if isinstance(value, dict) and (not prefix or (key not in _PAIR_KEYS and _looks_like_pairs(value))):
            found.update(_pair_tables(value, f"{prefix}.{key}" if prefix else key))
        else:
            own[key] = value
    if own:
        found[prefix] = own
    return found


def _looks_like_pairs(table: dict[str, Any]) -> bool:
    return any(key in _PAIR_KEYS or isinstance(value, dict) for key, value in table.items())


_MESSAGES = {
    "extra_forbidden": "unknown key",
    "missing": "missing key",
}


def _validation_message(error: ValidationError, label: str) -> str:
    """One line: `models.toml: pairs.foo.target.rpo: unknown key; ...`."""
    problems = []
    for item in error.errors():
        location = [str(part) for part in item["loc"] if part not in ("model", "kind")]
        message = _MESSAGES.get(item["type"], item["msg"])
        message = message.removeprefix("Value error, ")
        problems.append(f"{label}: {'.'.join(location)}: {message}")
    return "; ".join(dict.fromkeys(problems))
