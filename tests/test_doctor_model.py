"""`specli doctor -m/--target`: a model's stored costs and exact batch sizes, measured with --calibrate."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from specli.commands.cli import app

pytestmark = pytest.mark.slow


def test_doctor_reports_the_prior_until_calibrate_stores_costs_and_exact_sizes(smollm_path, tmp_path, monkeypatch,
                                                                              quiet_calibration):
    monkeypatch.setenv("SPECLI_CACHE", str(tmp_path))
    args = ["doctor", "--json", "--target", str(smollm_path), "-c", "256"]
    before = json.loads(CliRunner().invoke(app, args).stdout)["model"]
    assert before["costs"] == "prior" and before["verify_ms"] is None and before["exact_batch"] == {}
    calibrated = json.loads(CliRunner().invoke(app, [*args, "--calibrate"]).stdout)["model"]
    assert calibrated["costs"] == "calibrated" and calibrated["verify_ms"]["1"] > 0
    assert set(calibrated["exact_batch"]) == {"repack", "no_repack"}
    for spans in calibrated["exact_batch"].values():  # the context's one span (-c 256)
        assert [(span["start"], span["end"]) for span in spans] == [(0, 256)] and spans[0]["rows"] >= 1
    shown = CliRunner().invoke(app, args[:1] + args[2:]).stdout
    assert "repacking on:" in shown and "at positions 0-255" in shown, "the depths measured are shown"
    again = json.loads(CliRunner().invoke(app, args).stdout)["model"]
    assert again == calibrated, "read back from the store, not measured again"
