"""What llama.cpp was built with, the devices ggml can compute on (for `specli doctor`), and
the RPC servers' devices a model is placed on (for `--rpc`).

ggml's device API has no Python bindings in llama-cpp-python: its functions are called
through ctypes on the libggml that llama-cpp-python loaded, each bound once with its C
signature. This module does not import the binding: specli.llama.backend, which loads llama.cpp,
hands it the library when it is imported (`attach`), so the layers point one way.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
from dataclasses import dataclass
from typing import Callable


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
    "ggml_backend_dev_backend_reg": (ctypes.c_void_p, ctypes.c_void_p),
    "ggml_backend_reg_name": (ctypes.c_char_p, ctypes.c_void_p),
    "ggml_backend_reg_by_name": (ctypes.c_void_p, ctypes.c_char_p),
    "ggml_backend_reg_get_proc_address": (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p),
    "ggml_backend_reg_dev_count": (ctypes.c_size_t, ctypes.c_void_p),
    "ggml_backend_reg_dev_get": (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t),
    "ggml_backend_cpu_buffer_type": (ctypes.c_void_p,),
    "ggml_set_abort_callback": (ctypes.c_void_p, ctypes.c_void_p),
}
# ggml_backend_rpc_add_server, reached through the RPC registry as llama.cpp's common/arg.cpp does.
_ADD_SERVER = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)
# ggml_abort_callback_t: called with ggml's message before abort().
ABORT_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_char_p)
_DEVICE_FUNCTIONS = {name for name in _SIGNATURES if name.startswith("ggml_backend_dev_")}


@dataclass(frozen=True)
class Binding:
    """What this module needs of llama.cpp's binding (specli.llama.backend attaches it)."""

    library: ctypes.CDLL | None  # libggml as llama-cpp-python loaded it; None: not exposed
    init: Callable[[], None]  # starts llama.cpp's backends once per process
    versions: Callable[[], dict[str, str]]  # llama-cpp-python's version and llama.cpp's system info


_binding: Binding | None = None


def attach(binding: Binding) -> None:
    """Called once by specli.llama.backend as it loads llama.cpp."""
    global _binding
    _binding = binding
    _ggml.cache_clear()


def _bound() -> Binding:
    if _binding is None:
        raise RuntimeError("specli.llama.devices needs specli.llama.backend to be imported first")
    return _binding


@functools.cache
def _ggml() -> dict[str, Callable]:
    """The functions of _SIGNATURES that this libggml exports, bound once.

    Each is a new ctypes function object built from its prototype, so the library object
    llama-cpp-python shares is left as it is.
    """
    library = _bound().library
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
    versions = _bound().versions()
    return {
        "llama_cpp_python": versions["llama_cpp_python"],
        "ggml_version": _text(ggml["ggml_version"]()) if "ggml_version" in ggml else None,
        "ggml_commit": _text(ggml["ggml_commit"]()) if "ggml_commit" in ggml else None,
        "system_info": versions["system_info"],
    }


def _device(device: int) -> Device:
    ggml = _ggml()
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    ggml["ggml_backend_dev_memory"](device, ctypes.byref(free), ctypes.byref(total))
    kind = ggml["ggml_backend_dev_type"](device)
    return Device(
        name=_text(ggml["ggml_backend_dev_name"](device)) or "",
        description=_text(ggml["ggml_backend_dev_description"](device)) or "",
        kind=_DEVICE_KINDS.get(kind, f"type {kind}"),
        memory_free=free.value or None,
        memory_total=total.value or None,
    )


def backend_devices() -> list[Device] | None:
    """The devices ggml's backend registry knows; None when this build does not expose it."""
    ggml = _ggml()
    if not _DEVICE_FUNCTIONS <= ggml.keys():
        return None
    _bound().init()
    return [_device(ggml["ggml_backend_dev_get"](index)) for index in range(ggml["ggml_backend_dev_count"]())]


# --- llama.cpp RPC ------------------------------------------------------------


def rpc_supported() -> bool:
    """Whether this build has ggml's RPC backend (llama-cpp-python built with -DGGML_RPC=ON)."""
    ggml = _ggml()
    return "ggml_backend_reg_by_name" in ggml and bool(ggml["ggml_backend_reg_by_name"](b"RPC"))


@functools.cache
def rpc_server_devices(endpoint: str) -> tuple[int, ...]:
    """The devices of one RPC server (handles for llama_model_params.devices), connecting to it
    on first use. The servers are not added to ggml's registry, so a model placed by default
    (a draft without --draft-rpc) never lands on them.

    ggml-rpc aborts the process when the server cannot be reached: specli.llama.rpc.hello checks
    it, with a timeout, first.
    """
    ggml = _ggml()
    _bound().init()
    registry = ggml["ggml_backend_reg_by_name"](b"RPC")
    add_server = _ADD_SERVER(ggml["ggml_backend_reg_get_proc_address"](registry, b"ggml_backend_rpc_add_server"))
    server = add_server(endpoint.encode())
    if not server:
        return ()
    return tuple(ggml["ggml_backend_reg_dev_get"](server, index) for index in range(ggml["ggml_backend_reg_dev_count"](server)))


def rpc_devices(endpoint: str) -> list[Device]:
    """One RPC server's devices, described (name, memory free and total) for `specli doctor`."""
    return [_device(device) for device in rpc_server_devices(endpoint)]


def local_accelerators() -> list[int]:
    """The local devices llama.cpp places layers on by default: its GPUs, or, without one,
    its integrated GPUs (src/llama.cpp, llama_prepare_model_devices). The CPU is not listed:
    what no device takes stays on it."""
    ggml = _ggml()
    _bound().init()
    gpus, igpus = [], []
    for index in range(ggml["ggml_backend_dev_count"]()):
        device = ggml["ggml_backend_dev_get"](index)
        kind = _DEVICE_KINDS.get(ggml["ggml_backend_dev_type"](device))
        registry = _text(ggml["ggml_backend_reg_name"](ggml["ggml_backend_dev_backend_reg"](device))) or ""
        if kind == "gpu" and not registry.startswith("RPC"):
            gpus.append(device)
        elif kind == "igpu" and (not igpus or registry == igpus[0][1]):
            igpus.append((device, registry))
    return gpus or [device for device, _ in igpus]


def cpu_buffer_type() -> int:
    return _ggml()["ggml_backend_cpu_buffer_type"]()


_abort_handler = None  # the installed ABORT_CALLBACK, kept alive while ggml holds it


def set_abort_handler(handler: Callable[[str], None]) -> None:
    """Have ggml call `handler(message)` before it aborts the process (ggml-rpc aborts on any
    network fault). The handler may end the process itself; if it returns, ggml aborts. The
    first handler set stays (ggml holds its address)."""
    global _abort_handler
    if _abort_handler is None:
        _abort_handler = ABORT_CALLBACK(lambda message: handler(_text(message) or ""))
        _ggml()["ggml_set_abort_callback"](ctypes.cast(_abort_handler, ctypes.c_void_p))


def compute_fingerprint() -> str:
    """A short digest of what decides decode speed besides the model and its settings: the
    llama.cpp build (its CPU instruction sets and GPU backends) and the devices it sees. A
    reinstall with other flags (CUDA, AVX-512) or another GPU changes it."""
    build = llama_cpp_build()
    parts = [build["llama_cpp_python"], build["ggml_commit"], build["system_info"]]
    parts += [f"{device.name}:{device.description}" for device in backend_devices() or []]
    return hashlib.sha256("\n".join(str(part) for part in parts).encode()).hexdigest()[:12]
