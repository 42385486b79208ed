"""What this installation can do and where it keeps things (`specli doctor`).

Each check returns plain data; the command prints it as a table or as one JSON object. A
check that fails becomes a problem in the report (and exit code 1), never an exception.
"""

from __future__ import annotations

import platform
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from specli import __version__
from specli.install import CPU_FEATURES, GPU_INSTALL, RPC_INSTALL, cpu_install_command

if TYPE_CHECKING:
    from specli.llama.devices import Device

@dataclass
class Backend:
    llama_cpp_python: str | None = None
    ggml_version: str | None = None
    ggml_commit: str | None = None
    system_info: str | None = None
    gpu_offload: bool | None = None
    devices: list[Device] | None = None
    error: str | None = None
    # Instruction sets this CPU has and the build does not use (llama.cpp's names), and the
    # reinstall that uses them; None where the CPU's features cannot be read (not Linux x86).
    unused_cpu_features: list[str] | None = None
    cpu_install: str | None = None
    rpc: bool | None = None  # built with ggml's RPC backend (`--rpc`)
    images: bool | None = None  # binds llama.cpp's mtmd (`--image`, image_url parts)
    # Why this build cannot draft with a target's NextN layers (`--draft mtp`); None: it can.
    mtp_unsupported: str | None = None


@dataclass
class RpcServerState:
    """One `--rpc` server: whether it answered HELLO in time, its protocol and devices."""

    endpoint: str
    answers: bool
    protocol: str | None = None
    devices: list[Device] = field(default_factory=list)
    error: str | None = None


@dataclass
class Storage:
    specli_home: str
    specli_cache: str
    hub_cache: str
    free_bytes: int | None  # on the disk that holds the Hugging Face cache
    embedded_model: str | None = None  # the embedded model's GGUF in specli's cache; None: not installed
    embedded_model_bytes: int | None = None
    embedded_model_assembled: bool = False  # it is written there on first use


@dataclass
class PairState:
    name: str
    status: str  # "downloaded" | "partial" | "missing"
    size_bytes: int | None = None


@dataclass
class RegistryState:
    valid: bool
    files: list[str] = field(default_factory=list)
    pairs: list[PairState] = field(default_factory=list)
    error: str | None = None


@dataclass
class ModelState:
    """One model's stored costs and exact verify batch sizes (`doctor -m PAIR`)."""

    target: str
    costs: str  # "prior" | "learned" | "first run" | "calibrated"
    verify_ms: dict[int, float] | None  # by batch size; None for the prior, which has no unit
    verify_relative: dict[int, float]  # by batch size, against one token
    # "repack" / "no_repack": the exact verify batches where measured, by span of the context
    # ({"start", "end", "rows"}: batches starting in [start, end) have at most `rows` rows)
    exact_batch: dict[str, list[dict[str, int]]]
    nextn_layers: int = 0  # NextN (MTP) layers the file holds, which `--draft mtp` drafts with
    nextn_problem: str | None = None  # why the file's NextN layers cannot draft here (None: they can, or none)
    # Why drafts are not verified on this target (its recurrent state cannot be rolled back); None: they are.
    rewind_problem: str | None = None
    # The target's caches as llama.cpp allocated them for these options (Model.cache_memory):
    # kv_cache_bytes, and on a recurrent or hybrid target recurrent_bytes and recurrent_snapshots.
    memory: dict[str, int] = field(default_factory=dict)
    sequences: int = 1  # the sequences they hold (--parallel N)


@dataclass
class StoredCurve:
    """One stored verify-cost curve: what it holds for, how old it is, and whether it holds."""

    model: str  # the model file
    settings: str  # the load settings it holds for, as options
    source: str  # "first run" | "calibrated"
    measured_at: float | None  # Unix time; None: stored by an earlier specli
    one_token_ms: float
    state: str  # "ok", "stale: ...", "implausible: ...", "another build", "an earlier specli's"
    refresh: str  # the command that measures it again


@dataclass
class Report:
    specli: str
    python: str
    platform: str
    backend: Backend
    gpu_install: dict[str, str]
    storage: Storage
    registry: RegistryState
    problems: list[str] = field(default_factory=list)
    hints: list[str] = field(default_factory=list)  # faster settings; not problems (exit code 0)
    model: ModelState | None = None
    rpc_servers: list[RpcServerState] = field(default_factory=list)
    costs: list[StoredCurve] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def diagnose(rpc: tuple[str, ...] = ()) -> Report:
    backend = check_backend()
    registry = check_registry()
    problems = []
    if backend.error:
        problems.append(f"llama-cpp-python: {backend.error}")
    servers = check_rpc_servers(rpc) if rpc and backend.rpc else []
    if rpc and not backend.rpc:
        problems.append(f"this llama-cpp-python build has no RPC backend: {RPC_INSTALL}")
    problems += [server.error for server in servers if server.error]
    if registry.error:
        problems.append(f"registry: {registry.error}")
    hints = []
    if backend.mtp_unsupported:
        hints.append(f"--draft mtp (a target's own NextN layers) needs llama.cpp's MTP API: {backend.mtp_unsupported}")
    if backend.unused_cpu_features and not backend.gpu_offload:  # with a GPU the CPU kernels matter little
        hints.append(f"this CPU has {', '.join(backend.unused_cpu_features)}, which this llama.cpp build does not use; "
                     f"its batched verify is faster with them: {backend.cpu_install}")
    return Report(
        specli=__version__,
        python=platform.python_version(),
        platform=platform.platform(),
        backend=backend,
        gpu_install=dict(GPU_INSTALL),
        storage=check_storage(),
        registry=registry,
        problems=problems,
        hints=hints,
        rpc_servers=servers,
        costs=check_costs(),
    )


def check_costs() -> list[StoredCurve]:
    """Every verify-cost curve in the store: its age, source, and whether it still holds (a
    plausible shape, not marked stale by a run, measured by this build), with the command
    that measures it again."""
    from specli.decode.costs import curve_problem
    from specli.pricing.keys import COSTS_VERSION, build_key, cost_store, parse_settings_key

    try:
        build = build_key()
    except Exception:  # noqa: BLE001 - no working backend: the report says so elsewhere
        build = None
    store = cost_store()
    curves = []
    for key in store.keys():
        costs, parsed = store.costs(key), parse_settings_key(key)
        if costs is None or parsed is None:
            continue
        problem = curve_problem(costs.verify)
        if parsed.version != COSTS_VERSION:
            state = "an earlier specli's: not used"
        elif build is not None and parsed.build != build:
            state = "another build or devices: not used"
        elif problem is not None:
            state = f"implausible: {problem} (the next run measures again)"
        elif costs.stale is not None:
            state = f"stale: a run's verify steps took {costs.stale:.2f}x its price (the next run measures again)"
        else:
            state = "ok"
        curves.append(StoredCurve(parsed.path.name, _options(parsed.load), costs.source, costs.measured_at,
                                  1000 * costs.verify.get(1, 0.0), state,
                                  f"specli doctor --calibrate --target {parsed.path} {_options(parsed.load)}".rstrip()))
    return curves


def _options(load) -> str:
    """The options that load a model with these settings (defaults left out)."""
    from specli.llama.backend import LoadSettings

    default = LoadSettings()
    options = []
    if load.gpu_layers != default.gpu_layers:
        options.append(f"-ngl {load.gpu_layers}")
    if load.ctx_size != default.ctx_size:
        options.append(f"-c {load.ctx_size}")
    if load.threads is not None:
        options.append(f"-t {load.threads}")
    if not load.repack:
        options.append("--no-repack")
    if load.rpc:
        options.append(f"--rpc {','.join(load.rpc)}")
    return " ".join(options)


def check_rpc_servers(endpoints: tuple[str, ...]) -> list[RpcServerState]:
    """Each server's handshake (bounded, see specli.llama.rpc), then its devices and their memory."""
    from specli.llama import devices, rpc

    states = []
    for endpoint in endpoints:
        try:
            info = rpc.hello(rpc.parse_endpoints(endpoint)[0])
            rpc.connect([endpoint])
            states.append(RpcServerState(endpoint, True, ".".join(map(str, info.protocol)), devices.rpc_devices(endpoint)))
        except rpc.RpcError as error:
            states.append(RpcServerState(endpoint, False, error=str(error)))
    return states


SHOWN_BATCHES = (1, 2, 4, 8, 16, 32, 48)


def check_model(spec, calibrate: bool = False, notice=None) -> ModelState:
    """A model's stored costs and exact batch sizes; with `calibrate`, measured now and stored."""
    from specli.decode.costs import VerifyCurve
    from specli.pricing import exact_caps
    from specli.session import open_session

    from specli.llama.mtp import nextn_layers, nextn_problem

    exact = exact_caps(spec, notice, measure=calibrate, again=calibrate)
    with open_session(spec) as session:
        if calibrate:
            if notice is not None:
                notice("timing the target's verify batches")
            session.pricing.calibrate()
        costs = session.pricing.costs(measure=False)
        # (a target loaded without snapshots because nothing drafts has no problem drafting)
        problem = session.target.rewind_problem if spec.target_load.recurrent_snapshots else None
        memory = session.target.cache_memory()
    curve = VerifyCurve(costs.verify)
    relative = {size: curve.cost(size) / curve.cost(1) for size in SHOWN_BATCHES}
    absolute = None if costs.source == "prior" else {size: 1000 * curve.cost(size) for size in SHOWN_BATCHES}
    named = {"repack": exact.get(True), "no_repack": exact.get(False)}
    return ModelState(spec.target.name, costs.source, absolute, relative,
                      {name: cap.report() for name, cap in named.items() if cap is not None},
                      nextn_layers(spec.target), nextn_problem(spec.target), problem, memory,
                      spec.target_load.sequences)


def check_backend() -> Backend:
    try:
        from specli.llama import backend, devices, mtp, vision
    except Exception as error:  # a missing or broken shared library surfaces as anything
        return Backend(error=f"cannot be loaded ({type(error).__name__}: {error})")
    try:
        build = devices.llama_cpp_build()
        unused = unused_cpu_features(cpu_flags(), build.get("system_info"))
        return Backend(
            **build,
            gpu_offload=backend.supports_gpu_offload(),
            devices=devices.backend_devices(),
            rpc=devices.rpc_supported(),
            images=vision.available(),
            mtp_unsupported=mtp.unsupported_reason(),
            unused_cpu_features=None if unused is None else [name for name, _ in unused],
            cpu_install=cpu_install_command(unused) if unused else None,
        )
    except Exception as error:
        return Backend(error=f"cannot report its build ({type(error).__name__}: {error})")


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str] | None:
    """The CPU's feature flags as Linux lists them, or None where they cannot be read."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        label, _, value = line.partition(":")
        if label.strip() == "flags":
            return set(value.split())
    return None


def unused_cpu_features(flags: set[str] | None, system_info: str | None) -> list[tuple[str, str]] | None:
    """(llama.cpp name, CMake option) of each CPU_FEATURES entry the CPU has and the build
    lacks; None when either side is unknown. llama.cpp's system info lists what its CPU
    backend was built for as "NAME = 1"."""
    if flags is None or not system_info:
        return None
    built = set(re.findall(r"\b([A-Z0-9_]+) = 1\b", system_info))
    return [(name, option) for flag, name, option in CPU_FEATURES if flag in flags and name not in built]


def check_storage() -> Storage:
    from specli.config import cache_dir, specli_home
    from specli.models.demo import embedded_model
    from specli.models.hub import free_space, hub_cache_dir

    hub_cache = hub_cache_dir()
    embedded = embedded_model()
    return Storage(
        specli_home=str(specli_home()),
        specli_cache=str(cache_dir()),
        hub_cache=str(hub_cache),
        free_bytes=free_space(hub_cache),
        embedded_model=str(embedded.path) if embedded else None,
        embedded_model_bytes=embedded.size if embedded else None,
        embedded_model_assembled=bool(embedded and embedded.assembled),
    )


def check_registry() -> RegistryState:
    from specli.errors import SpecliError
    from specli.models import hub
    from specli.models.registry import load_registry

    try:
        registry = load_registry()
    except SpecliError as error:
        return RegistryState(valid=False, error=str(error))
    pairs = []
    for pair in registry.pairs.values():
        try:
            status = hub.pair_status(pair)
            pairs.append(PairState(pair.name, status.state, status.size))
        except (OSError, SpecliError) as error:
            pairs.append(PairState(pair.name, f"unknown ({error})"))
    return RegistryState(valid=True, files=[str(source) for source in registry.sources], pairs=pairs)


def caches_line(memory: dict[str, int], sequences: int = 1) -> str:
    """A target's caches (Model.cache_memory) in a line: its KV cache, and a recurrent or
    hybrid target's states with their snapshots, for `sequences` sequences."""
    from specli.models.hub import format_size

    line = f"KV {format_size(memory.get('kv_cache_bytes', 0))}"
    if "recurrent_snapshots" in memory:
        snapshots = memory["recurrent_snapshots"]
        kept = (f"{snapshots} snapshot{'s' if snapshots != 1 else ''} a sequence, for drafts of up to {snapshots}"
                if snapshots else "no snapshots: nothing drafts")
        line += f", recurrent state {format_size(memory.get('recurrent_bytes', 0))}"
        line += f" for {sequences} sequences ({kept})" if sequences > 1 else f" ({kept})"
    elif sequences > 1:
        line += f" for {sequences} sequences"
    return line
