"""The GGUF files other tools already keep on this machine, found where each tool keeps them.

- Hugging Face cache: `HF_HUB_CACHE`, else `HF_HOME/hub`, else ~/.cache/huggingface/hub; a model
  is `models--OWNER--NAME/snapshots/COMMIT/FILE.gguf` (named `OWNER/NAME/FILE.gguf`).
- Ollama: `OLLAMA_MODELS`, else ~/.ollama/models. A manifest under `manifests/HOST/NAMESPACE/
  NAME/TAG` lists layers; the one of media type `application/vnd.ollama.image.model` is the
  GGUF, a blob `blobs/sha256-DIGEST` (named `ollama:NAME:TAG`, with the namespace where it is
  not `library`).
- LM Studio: ~/.lmstudio/models, and the older ~/.cache/lm-studio/models (`PUBLISHER/REPO/FILE`).
- llama.cpp's `-hf` cache: `LLAMA_CACHE`, else ~/.cache/llama.cpp.

Nothing here reads a model file: a missing store is skipped, and an unreadable folder, a
manifest that points nowhere or a symlink loop is one problem line; the rest is still found.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from specli.errors import ModelFileError

OLLAMA_MODEL = "application/vnd.ollama.image.model"
OLLAMA_PROJECTOR = "application/vnd.ollama.image.projector"
OLLAMA_REGISTRY = "registry.ollama.ai"


@dataclass(frozen=True)
class Store:
    name: str  # "hf", "ollama", "lmstudio", "llama.cpp"
    root: Path


@dataclass(frozen=True)
class LocalFile:
    store: str
    name: str  # how a person would name it: OWNER/NAME/FILE.gguf, ollama:NAME:TAG, PUBLISHER/REPO/FILE
    path: Path


def stores(environ: dict[str, str] | None = None, home: Path | None = None) -> list[Store]:
    """Every store this machine's environment names, whether it exists or not."""
    env = os.environ if environ is None else environ
    home = Path.home() if home is None else home
    hf = Path(env["HF_HUB_CACHE"]) if env.get("HF_HUB_CACHE") else \
        (Path(env["HF_HOME"]) / "hub" if env.get("HF_HOME") else home / ".cache" / "huggingface" / "hub")
    ollama = Path(env["OLLAMA_MODELS"]) if env.get("OLLAMA_MODELS") else home / ".ollama" / "models"
    llama = Path(env["LLAMA_CACHE"]) if env.get("LLAMA_CACHE") else home / ".cache" / "llama.cpp"
    return [Store("hf", hf), Store("ollama", ollama), Store("lmstudio", home / ".lmstudio" / "models"),
            Store("lmstudio", home / ".cache" / "lm-studio" / "models"), Store("llama.cpp", llama)]


def find_files(found_stores: list[Store]) -> tuple[list[LocalFile], list[str]]:
    """(the GGUF files in the stores, one line per problem met on the way)."""
    files: list[LocalFile] = []
    problems: list[str] = []
    seen: set[Path] = set()
    for store in found_stores:
        if not store.root.is_dir():
            problems.append(f"{store.name}: no store at {store.root}")
            continue
        finder = _ollama_files if store.name == "ollama" else _hf_files if store.name == "hf" else _plain_files
        for item in finder(store, problems):
            try:
                real = item.path.resolve(strict=True)
            except (OSError, RuntimeError) as error:  # a dangling link, a loop
                problems.append(f"{store.name}: {item.path}: {getattr(error, 'strerror', None) or error}")
                continue
            if real not in seen:  # a blob that two names (or two stores) point at, listed once
                seen.add(real)
                files.append(item)
    return files, problems


def _walk(root: Path, problems: list[str], store: str) -> Iterator[Path]:
    """Every *.gguf under root (folders by symlink are not followed: no loops)."""
    def failed(error: OSError) -> None:
        problems.append(f"{store}: cannot read {error.filename}: {error.strerror or error}")

    for folder, folders, names in os.walk(root, onerror=failed):
        folders.sort()
        for name in sorted(names):
            if name.lower().endswith(".gguf"):
                yield Path(folder) / name


def _plain_files(store: Store, problems: list[str]) -> Iterator[LocalFile]:
    for path in _walk(store.root, problems, store.name):
        yield LocalFile(store.name, path.relative_to(store.root).as_posix(), path)


def _hf_files(store: Store, problems: list[str]) -> Iterator[LocalFile]:
    for path in _walk(store.root, problems, store.name):
        parts = path.relative_to(store.root).parts
        if len(parts) >= 4 and parts[0].startswith("models--") and parts[1] == "snapshots":
            repo = parts[0][len("models--"):].replace("--", "/")
            yield LocalFile(store.name, f"{repo}/{'/'.join(parts[3:])}", path)


def _ollama_files(store: Store, problems: list[str]) -> Iterator[LocalFile]:
    manifests = store.root / "manifests"
    for folder, _, names in os.walk(manifests, onerror=lambda error: problems.append(
            f"ollama: cannot read {error.filename}: {error.strerror or error}")):
        for tag in sorted(names):
            manifest = Path(folder) / tag
            parts = manifest.relative_to(manifests).parts  # HOST/NAMESPACE/NAME/TAG
            if len(parts) != 4:
                continue
            name = ollama_name(parts)
            try:
                yield LocalFile("ollama", name, ollama_blob(store.root, manifest, name))
            except ModelFileError as error:
                problems.append(error.message)  # it begins with the ollama: name


def ollama_name(parts: tuple[str, ...]) -> str:
    host, namespace, model, tag = parts
    prefix = "" if host == OLLAMA_REGISTRY else f"{host}/"
    prefix += "" if namespace == "library" else f"{namespace}/"
    return f"ollama:{prefix}{model}:{tag}"


def ollama_blob(root: Path, manifest: Path, name: str) -> Path:
    """The GGUF blob a manifest names; ModelFileError says why a tag is not one GGUF."""
    try:
        layers = json.loads(manifest.read_text(encoding="utf-8")).get("layers") or []
    except (OSError, ValueError, AttributeError) as error:
        raise ModelFileError(f"{name}: cannot read its manifest {manifest}: {error}") from None
    kinds = [layer.get("mediaType", "") for layer in layers if isinstance(layer, dict)]
    models = [layer for layer in layers if isinstance(layer, dict) and layer.get("mediaType") == OLLAMA_MODEL]
    if not models:
        other = ", ".join(sorted(set(kinds))) or "none"
        raise ModelFileError(f"{name} is not a GGUF model (its layers: {other}; safetensors or MLX tags are not GGUF)")
    if OLLAMA_PROJECTOR in kinds:
        raise ModelFileError(f"{name} bundles a vision projector: specli serves text models")
    digest = str(models[0].get("digest", ""))
    blob = root / "blobs" / digest.replace(":", "-")
    if not digest.startswith("sha256:") or not blob.is_file():
        raise ModelFileError(f"{name}: its manifest names blob {digest or '(none)'}, which is not in {root / 'blobs'}",
                             "pull it again with `ollama pull`")
    return blob


def resolve_ollama(reference: str, environ: dict[str, str] | None = None, home: Path | None = None) -> Path:
    """`ollama:NAME[:TAG]` (TAG defaults to latest; NAME may hold a namespace): the blob where
    Ollama keeps it, used in place."""
    root = stores(environ, home)[1].root
    body = reference[len("ollama:"):]
    name, _, tag = body.rpartition(":") if ":" in body.split("/")[-1] else (body, "", "latest")
    pieces = name.split("/")
    host, namespace = OLLAMA_REGISTRY, "library"
    if len(pieces) == 3:
        host, namespace, model = pieces
    elif len(pieces) == 2:
        namespace, model = pieces
    else:
        model = pieces[0]
    manifest = root / "manifests" / host / namespace / model / tag
    if not manifest.is_file():
        raise ModelFileError(f"{reference}: Ollama has no such model in {root}", f"`ollama pull {body}` first")
    blob = ollama_blob(root, manifest, ollama_name((host, namespace, model, tag)))
    _refuse_bundled_vision(blob, reference)
    return blob


VISION_TENSORS = ("v.", "mm.")  # a vision encoder's and its projector's tensors (Ollama's bundled blobs)


def _refuse_bundled_vision(blob: Path, reference: str) -> None:
    """Ollama's newer engine keeps a vision model's encoder in the model blob itself, a GGUF
    llama.cpp's text path does not load: refused in one line (a header read)."""
    from specli.llama.gguf_header import read_header

    header = read_header(blob)
    bundled = [tensor.name for tensor in header.tensors if tensor.name.startswith(VISION_TENSORS)]
    if bundled:
        raise ModelFileError(f"{reference} bundles vision tensors in its blob ({len(bundled)}, such as "
                             f"{bundled[0]}): it is not a single text GGUF", "use a text-only tag of the model")
