"""Quantize a GGUF as people download them: through llama.cpp's own llama_model_quantize
(what `llama-quantize` runs), for test models written in F32."""

from __future__ import annotations

from pathlib import Path

import llama_cpp

TYPES = {"Q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0, "Q4_K_M": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M}


def quantize(source: Path, out: Path, kind: str, threads: int = 2) -> Path:
    """`source` written again as `kind` (a key of TYPES) at `out`; the path."""
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = TYPES[kind]
    params.nthread = threads
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    status = llama_cpp.llama_model_quantize(str(source).encode(), str(partial).encode(), params)
    if status != 0:
        raise RuntimeError(f"llama_model_quantize failed ({status}) for {source} as {kind}")
    partial.replace(out)
    return out
