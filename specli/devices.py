"""What llama.cpp was built with and the devices ggml can compute on, for `specli doctor`.

ggml's device API has no Python bindings in llama-cpp-python: its functions are called
through ctypes on the libggml that llama-cpp-python loaded (backend.ggml_library), each
bound once with its C signature.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
from dataclasses import dataclass
from typing import Callable

from specli import backend


@dataclass(frozen=True)
class Device:
    """A device ggml can compute on (the CPU, a CUDA or Metal GPU, an accelerator)."""

    name: str
    description: str
    kind: str  # "cpu" | "gpu" | "igpu" | "accel"
    memory_free: int | None = None
    memory_total: int | None = None


_DEVICE_KINDS = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel"}  # enum ggml_backend_dev_type

_SIZE_POINTER = ctypes.POINTER(ctypes.c_size_t)
# The ggml functions used here: name -> (return type, argument types), as declared in ggml.h
# and ggml-backend.h.
_SIGNATURES: dict[str, tuple] = {
    "ggml_version": (ctypes.c_char_p,),
    "ggml_commit": (ctypes.c_char_p,),
    "ggml_backend_dev_count": (ctypes.c_size_t,),
    "ggml_backend_dev_get": (ctypes.c_void_p, ctypes.c_size_t),
    "ggml_backend_dev_name": (ctypes.c_char_p, ctypes.c_void_p),
    "ggml_backend_dev_description": (ctypes.c_char_p, ctypes.c_void_p),
    "ggml_backend_dev_type": (ctypes.c_int, ctypes.c_void_p),
    "ggml_backend_dev_memory": (None, ctypes.c_void_p, _SIZE_POINTER, _SIZE_POINTER),
}
_DEVICE_FUNCTIONS = {name for name in _SIGNATURES if name.startswith("ggml_backend_dev_")}


@functools.cache
def _ggml() -> dict[str, Callable]:
    """The functions of _SIGNATURES that this libggml exports, bound once.

    Each is a new ctypes function object built from its prototype, so the library object
    llama-cpp-python shares is left as it is.
    """
    library = backend.ggml_library()
    if library is None:
        return {}
    functions = {}
    for name, (restype, *argtypes) in _SIGNATURES.items():
        if hasattr(library, name):
            functions[name] = ctypes.CFUNCTYPE(restype, *argtypes)((name, library))
    return functions


def _text(value: bytes | None) -> str | None:
    return value.decode("utf-8", "replace") if value else None


def llama_cpp_build() -> dict[str, str | None]:
    """llama-cpp-python's version, the ggml it bundles (version and commit), and llama.cpp's
    own summary of the CPU features and backends it was built with."""
    ggml = _ggml()
    versions = backend.library_versions()
    return {
        "llama_cpp_python": versions["llama_cpp_python"],
        "ggml_version": _text(ggml["ggml_version"]()) if "ggml_version" in ggml else None,
        "ggml_commit": _text(ggml["ggml_commit"]()) if "ggml_commit" in ggml else None,
        "system_info": versions["system_info"],
    }


def backend_devices() -> list[Device] | None:
    """The devices ggml's backend registry knows; None when this build does not expose it."""
    ggml = _ggml()
    if not _DEVICE_FUNCTIONS <= ggml.keys():
        return None
    backend.init_backend()
    devices = []
    for index in range(ggml["ggml_backend_dev_count"]()):
        device = ggml["ggml_backend_dev_get"](index)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        ggml["ggml_backend_dev_memory"](device, ctypes.byref(free), ctypes.byref(total))
        kind = ggml["ggml_backend_dev_type"](device)
        devices.append(
            Device(
                name=_text(ggml["ggml_backend_dev_name"](device)) or "",
                description=_text(ggml["ggml_backend_dev_description"](device)) or "",
                kind=_DEVICE_KINDS.get(kind, f"type {kind}"),
                memory_free=free.value or None,
                memory_total=total.value or None,
            )
        )
    return devices


def compute_fingerprint() -> str:
    """A short digest of what decides decode speed besides the model and its settings: the
    llama.cpp build (its CPU instruction sets and GPU backends) and the devices it sees. A
    reinstall with other flags (CUDA, AVX-512) or another GPU changes it."""
    build = llama_cpp_build()
    parts = [build["llama_cpp_python"], build["ggml_commit"], build["system_info"]]
    parts += [f"{device.name}:{device.description}" for device in backend_devices() or []]
    return hashlib.sha256("\n".join(str(part) for part in parts).encode()).hexdigest()[:12]
