"""`specli doctor`'s CPU check: instruction sets the CPU has and the llama.cpp build does not use."""

from __future__ import annotations

from specli import diagnostics
from specli import install
from specli.commands.doctor import print_report

NATIVE_OFF = "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | "
AVX512_BUILD = NATIVE_OFF + "AVX512 = 1 | AVX512_VBMI = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | "
AVX512_CPU = {"fpu", "sse2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512dq", "avx512vbmi", "avx512_vnni", "avx512_bf16"}


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu avx2 avx512f avx512_vnni\n\nprocessor\t: 1\n")
    assert diagnostics.cpu_flags(cpuinfo) == {"fpu", "avx2", "avx512f", "avx512_vnni"}
    assert diagnostics.cpu_flags(tmp_path / "absent") is None
    (tmp_path / "arm").write_text("processor\t: 0\nFeatures\t: fp asimd\n")
    assert diagnostics.cpu_flags(tmp_path / "arm") is None


def test_a_portable_build_on_an_avx512_cpu_misses_avx512():
    unused = diagnostics.unused_cpu_features(AVX512_CPU, NATIVE_OFF)
    assert unused == [("AVX512", "GGML_AVX512"), ("AVX512_VBMI", "GGML_AVX512_VBMI"),
                      ("AVX512_VNNI", "GGML_AVX512_VNNI"), ("AVX512_BF16", "GGML_AVX512_BF16")]
    command = install.cpu_install_command(unused)
    assert command.startswith('CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_RPC=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON ')
    assert command.endswith('" pip install --force-reinstall --no-cache-dir llama-cpp-python')


def test_nothing_is_missing_where_the_build_matches_the_cpu():
    assert diagnostics.unused_cpu_features(AVX512_CPU, AVX512_BUILD) == []
    assert diagnostics.unused_cpu_features({"avx2", "fma", "f16c"}, NATIVE_OFF) == []
    # AVX512 built but not AVX512_BF16 (a CPU without it): only what the CPU has counts.
    assert diagnostics.unused_cpu_features({"avx2", "avx512f"}, AVX512_BUILD.replace("AVX512_BF16 = 1 | ", "")) == []
    # A build without AVX2 on an AVX2 CPU.
    assert diagnostics.unused_cpu_features({"avx2"}, "CPU : SSE3 = 1 | AVX = 1 | ") == [("AVX2", "GGML_AVX2")]


def test_unknown_cpu_or_build_says_nothing():
    assert diagnostics.unused_cpu_features(None, NATIVE_OFF) is None
    assert diagnostics.unused_cpu_features(AVX512_CPU, None) is None


def test_the_report_hints_at_the_faster_build_without_failing(monkeypatch):
    monkeypatch.setattr(diagnostics, "cpu_flags", lambda: AVX512_CPU)
    report = diagnostics.diagnose()
    assert report.backend.error is None
    if report.backend.gpu_offload:
        assert report.hints == []  # the GPU does the verifying
        return
    built = report.backend.system_info
    if "AVX512 = 1" in built:
        assert report.hints == []
    else:
        assert report.backend.unused_cpu_features[0] == "AVX512"
        assert len(report.hints) == 1 and "-DGGML_AVX512=ON" in report.hints[0]
    assert report.problems == []


def test_the_report_says_where_the_embedded_model_lives_and_how_big_it_is(monkeypatch, tmp_path, gemma_path):
    import io
    import json

    from rich.console import Console

    monkeypatch.setenv("SPECLI_CACHE", str(tmp_path))
    path = tmp_path / "models" / "gemma-3-270m-q4_k_m.gguf"
    storage = diagnostics.check_storage()
    assert (storage.embedded_model, storage.embedded_model_assembled) == (str(path), False)
    assert storage.embedded_model_bytes == gemma_path.stat().st_size  # the model, before it is written there

    path.parent.mkdir()
    path.write_bytes(b"GGUF" + bytes(1996))  # stands in for the assembled file
    report = diagnostics.diagnose()
    stored = json.loads(json.dumps(report.to_dict()))["storage"]  # as `doctor --json` prints it
    assert (stored["embedded_model"], stored["embedded_model_bytes"], stored["embedded_model_assembled"]) == (str(path), 2000, True)
    out = io.StringIO()
    print_report(report, Console(file=out, width=300, highlight=False))
    assert f"embedded model    {path} (2.0 kB)" in out.getvalue()


def test_the_device_probe_sees_the_cpu_and_the_fingerprint_is_stable():
    from specli.llama import devices

    found = devices.backend_devices()
    assert found is not None and any(device.kind == "cpu" and device.name for device in found)
    build = devices.llama_cpp_build()
    assert build["llama_cpp_python"] and build["ggml_version"] and "CPU :" in build["system_info"]
    fingerprint = devices.compute_fingerprint()
    assert len(fingerprint) == 12 and devices.compute_fingerprint() == fingerprint
    report = diagnostics.check_backend()
    assert report.error is None and report.devices == found


def _doctor_at(columns: int, monkeypatch) -> list[str]:
    from typer.testing import CliRunner

    from specli.commands.app import app

    monkeypatch.setenv("COLUMNS", str(columns))
    result = CliRunner().invoke(app, ["doctor"])
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()


def test_doctor_lists_the_pairs_on_disk_and_counts_the_others_in_one_line(monkeypatch):
    from specli.models.registry import load_registry

    lines = _doctor_at(100, monkeypatch)
    names = list(load_registry().pairs)  # an empty Hugging Face cache: only the embedded pair is on disk
    assert [line.split()[:2] for line in lines if line.startswith("gemma-3-270m ")] == [["gemma-3-270m", "downloaded"]]
    for name in names[1:]:
        assert not any(line.split()[:1] == [name] for line in lines), name
    assert not any("missing" in line for line in lines)
    assert f"not downloaded: {len(names) - 1} pairs (`specli list` shows them, `specli pull PAIR` downloads one)" in lines


def test_every_line_of_doctor_fits_100_columns(monkeypatch):
    lines = _doctor_at(100, monkeypatch)
    assert any(line.startswith("build ") for line in lines)  # llama.cpp's system info, longer than 100 whole
    assert [line for line in lines if len(line) > 100] == []
    assert lines == [line.rstrip() for line in lines]  # no padding


def test_a_report_with_long_values_fits_100_columns_and_names_the_pairs_on_disk():
    import io

    from rich.console import Console

    report = diagnostics.diagnose()
    pairs = report.registry.pairs
    pairs[1].status, pairs[1].size_bytes = "partial", 4_000_000_000
    pairs[2].status = "unknown (cannot read " + "/very/long/path" * 8 + ": Permission denied)"
    report.costs = [
        diagnostics.StoredCurve("deepseek-r1-distill-qwen-32b-q4_k_m.gguf", "-ngl 20 -c 8192 --rpc 10.0.0.2:50052,10.0.0.3:50052",
                                "calibrated", None, 123.4, "stale: a run's verify steps took 1.37x its price (the next run measures again)",
                                "specli doctor --calibrate --target /models/deepseek.gguf -ngl 20"),
        diagnostics.StoredCurve("Qwen3-Coder-30B-A3B-Instruct-UD-Q4_K_XL-00001-of-00002.gguf", "", "first run", None, 13.4,
                                "another build or devices: not used", "-"),
    ]
    out = io.StringIO()
    print_report(report, Console(file=out, width=100, highlight=False))
    lines = [line.rstrip() for line in out.getvalue().splitlines()]
    assert [line for line in lines if len(line) > 100] == []
    rows = [line.split()[:2] for line in lines if line.split()[:1] in ([pair.name] for pair in pairs)]
    assert rows == [[pairs[0].name, "downloaded"], [pairs[1].name, "partial"], [pairs[2].name, "unknown"]]
    assert f"not downloaded: {len(pairs) - 3} pairs (`specli list` shows them, `specli pull PAIR` downloads one)" in lines
    assert any(line.endswith("stale") for line in lines) and any(line.endswith("other build") for line in lines)
    assert "other build: measured by another llama.cpp build or on other devices; not used here" in lines
