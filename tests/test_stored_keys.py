"""The stored costs' keys and fields do not change unnoticed: a change in them forgets every
curve, draft cost, exact batch size and measured speed-up a user has stored. Both checks
compare byte for byte with golden files under tests/data/golden/ (SPECLI_WRITE_GOLDEN=1
writes them anew: only where the stored format is meant to change, with COSTS_VERSION)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from specli import pricing
from specli.decode.costs import BusyMark, Calibration, CostStore, StepCosts
from specli.decode.exact import BatchCap
from specli.llama.backend import LoadSettings
from specli.pricing.keys import draft_key, exact_key, parse_settings_key, settings_key
from specli.session import SessionSpec, open_session

GOLDEN = Path(__file__).resolve().parent / "data" / "golden"
MTIME_NS = 1_700_000_000_123_456_789
BUILD = "0.3.36|0123456789ab"
LOADS = (LoadSettings(), LoadSettings(gpu_layers=0, ctx_size=512, threads=2, repack=False),
         LoadSettings(gpu_layers=12, rpc=("10.0.0.2:50052", "10.0.0.3:50052")))
KEYED = ("gpu_layers", "threads", "repack", "ctx_size", "rpc")  # the load settings a key holds
COSTS = StepCosts({1: 0.0125, 2: 0.02, 4: 0.03125, 16: 0.0875}, 0.0015, 0.00025, "calibrated", 0.625, 0.00075,
                  1_700_000_000.5, 1.75)
EXACT = BatchCap(((0, 256, 3), (256, 1024, 1)))
BUSY = BusyMark(1_700_000_000.25, 2)  # two first runs in a row found the machine too busy to measure


def _compare(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("SPECLI_WRITE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8"), f"{name} changed: stored costs would be forgotten"


def _model_file(folder: Path, name: str, size: int) -> Path:
    path = folder / name
    path.write_bytes(b"GGUF" + bytes(size - 4))
    os.utime(path, ns=(MTIME_NS, MTIME_NS))
    return path


def test_the_keys_and_fields_of_stored_costs_are_unchanged(tmp_path):
    target, draft = _model_file(tmp_path, "target.gguf", 1024), _model_file(tmp_path, "draft.gguf", 512)
    keys = [settings_key(target, load, BUILD) for load in LOADS]
    drafts = [draft_key(key, draft, load) for key, load in zip(keys, LOADS)]
    store = CostStore(tmp_path / "cache" / "costs.json")
    for key, drafted, load in zip(keys, drafts, LOADS):
        store.put_costs(key, COSTS)
        store.put(exact_key(target, load, BUILD), EXACT.to_json())
        store.put(drafted, 0.0015)
        for beside, value in (("catch_up", 0.00075), ("acceptance", 0.625), ("speedup", 1.25)):
            store.put(drafted.beside(beside), value)
    store.put_busy_mark(keys[0].beside("busy"), BUSY)
    parsed = []
    for key in keys:
        costs_key = parse_settings_key(key)
        assert costs_key is not None
        load = {name: getattr(costs_key.load, name) for name in KEYED}
        parsed.append({"path": str(costs_key.path), "load": load, "build": costs_key.build, "version": costs_key.version})
    written = (tmp_path / "cache" / "costs.json").read_text()
    report = {"settings_keys": keys, "exact_keys": [exact_key(target, load, BUILD) for load in LOADS],
              "draft_keys": drafts, "parsed": parsed, "costs.json": written}
    text = json.dumps(report, indent=1, sort_keys=True).replace(str(tmp_path.resolve()), "<tmp>") + "\n"
    _compare("costs_keys.json", text)
    assert StepCosts.from_json(json.loads(written)[keys[0]]) == COSTS, "read back as written"
    assert BusyMark.from_json(json.loads(written)[keys[0].beside("busy")]) == BUSY


def _masked(key: str, model: Path) -> str:
    info = model.stat()
    for real, mask in ((str(model.resolve()), "<model>"), (f"|{info.st_size}|", "|<size>|"),
                       (f"|{info.st_mtime_ns}|", "|<mtime>|")):
        key = key.replace(real, mask)
    parts = key.split("|")
    # The build and devices (llama-cpp-python's version, the device fingerprint) follow the settings.
    parts[7:9] = ["<build>", "<devices>"]
    return "|".join(parts)


def _unclocked(value: object) -> object:
    """A stored value with the time it was measured at left out."""
    return {**value, "measured_at": "<time>"} if isinstance(value, dict) and value.get("measured_at") else value


def _timed(decode, rewind, token, sizes, passes=3, threads=None, steady=False, verify_curve=True) -> Calibration:
    """A calibration as a quiet machine makes one (load here would leave nothing stored)."""
    return Calibration({size: 0.01 * (1 + 0.5 * (size - 1)) for size in sizes}, 0.01, 0.0, None)


@pytest.mark.slow
def test_a_first_run_with_a_draft_stores_the_same_keys_and_fields(smollm_path, tmp_path, monkeypatch):
    """What a session stores on a model's first run with a draft of its vocabulary: the
    target's curve, the draft's cost per token, catch-up and agreement (the model drafting
    for itself agrees everywhere)."""
    monkeypatch.setenv("SPECLI_CACHE", str(tmp_path))
    monkeypatch.setattr(pricing, "calibrate", _timed)
    load = LoadSettings(ctx_size=256)
    with open_session(SessionSpec(smollm_path, smollm_path, load, load)) as session:
        session.pricing.costs(kind="model")
    stored = json.loads((tmp_path / "costs.json").read_text())
    masked = {_masked(key, smollm_path): _unclocked(value) for key, value in stored.items()}
    _compare("costs_keys_first_run.json", json.dumps(masked, indent=1, sort_keys=True) + "\n")
