"""benchmarks/gpu: dealing wheels into carryable folders and gathering them, and the results."""

from __future__ import annotations

import json
import shutil

import pytest

from benchmarks.gpu import results, wheels


def make_files(tmp_path, sizes: dict[str, int]):
    source = tmp_path / "downloads"
    source.mkdir()
    paths = []
    for index, (name, size) in enumerate(sizes.items()):
        path = source / name
        path.write_bytes(bytes((index * 7 + i) % 251 for i in range(size)))
        paths.append(path)
    return paths


def test_files_are_dealt_in_order_and_a_large_one_is_split(tmp_path):
    paths = make_files(tmp_path, {"a.whl": 300, "b.whl": 500, "model.whl": 2500})
    manifest = wheels.deal(paths, tmp_path / "out", limit=1000)
    assert manifest["folders"] == ["01", "02", "03", "04"]
    assert [part["folder"] for part in manifest["files"]["a.whl"]["parts"]] == ["01"]
    assert [part["name"] for part in manifest["files"]["model.whl"]["parts"]] == [
        "model.whl.part1of3", "model.whl.part2of3", "model.whl.part3of3"]
    for folder in manifest["folders"]:
        size = sum(p.stat().st_size for p in (tmp_path / "out" / folder).iterdir() if p.name != wheels.MANIFEST)
        assert size <= 1000
        assert json.loads((tmp_path / "out" / folder / wheels.MANIFEST).read_text()) == manifest


def test_gather_joins_a_file_once_all_its_folders_arrived(tmp_path, capsys):
    paths = make_files(tmp_path, {"a.whl": 300, "model.whl": 2500})
    wheels.deal(paths, tmp_path / "out", limit=1000)
    carried, store = tmp_path / "carried", tmp_path / "store"
    carried.mkdir()
    shutil.copytree(tmp_path / "out" / "01", carried / "01")
    shutil.copytree(tmp_path / "out" / "02", carried / "02")
    assert wheels.gather(carried, store, ["a.whl"]) == 0
    assert wheels.gather(carried, store, ["model*"]) == 1
    assert "model.whl incomplete: bring folder(s) 03, 04" in capsys.readouterr().err
    # Each later call carries one more folder; the parts gathered before stay in the store.
    for folder, complete in (("03", False), ("04", True)):
        shutil.rmtree(carried)
        carried.mkdir()
        shutil.copytree(tmp_path / "out" / folder, carried / folder)
        assert wheels.gather(carried, store, ["model*", "a.whl"]) == (0 if complete else 1)
    assert (store / "model.whl").read_bytes() == paths[1].read_bytes()
    assert not list(store.glob("*.part*"))


def test_gather_removes_a_file_that_fails_its_checksum(tmp_path, capsys):
    paths = make_files(tmp_path, {"a.whl": 300})
    wheels.deal(paths, tmp_path / "out", limit=1000)
    (tmp_path / "out" / "01" / "a.whl").write_bytes(b"x" * 300)
    assert wheels.gather(tmp_path / "out", tmp_path / "store", ["a.whl"]) == 1
    assert "failed its SHA-256 check" in capsys.readouterr().err
    assert not (tmp_path / "store" / "a.whl").exists()


def test_llama_bench_records_become_seconds_by_batch_size(tmp_path):
    records = [
        {"n_prompt": 1, "n_gen": 0, "n_depth": 512, "avg_ns": 5_000_000, "stddev_ns": 10_000, "gpu_info": "H100",
         "model_type": "llama 8B F16", "build_commit": "abc"},
        {"n_prompt": 4, "n_gen": 0, "n_depth": 512, "avg_ns": 5_300_000, "stddev_ns": 10_000},
        {"n_prompt": 0, "n_gen": 128, "n_depth": 512, "avg_ns": 700_000_000},  # a generation test: not a verify
    ]
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(records))
    costs = results.costs(path)
    assert costs["seconds"] == {"1": pytest.approx(0.005), "4": pytest.approx(0.0053)}
    assert "H100" in costs["source"] and "512 tokens" in costs["source"]


def compare_result(k: int, speed: float, ngram_n: int | None = None) -> dict:
    tools = {"llama.cpp": {"median_tokens_per_second": speed, "median_acceptance_rate": 0.8}}
    return {"workload": {"k": k, "ngram_n": ngram_n}, "tools": tools}


def test_the_fastest_llama_cpp_setting_is_chosen(tmp_path):
    files = []
    for k, speed in ((4, 90.0), (8, 120.0), (16, 110.0)):
        files.append(tmp_path / f"k{k}.json")
        files[-1].write_text(json.dumps(compare_result(k, speed)))
    best = results.best(files)
    assert best["k"] == 8 and len(best["candidates"]) == 3


def test_junit_counts_and_names_the_failures(tmp_path):
    xml = tmp_path / "tests.xml"
    xml.write_text(
        '<testsuites><testsuite tests="3" failures="1" errors="0" skipped="1" time="2.5">'
        '<testcase classname="tests.test_x" name="test_ok"/>'
        '<testcase classname="tests.test_x" name="test_bad"><failure message="assert 1 == 2">tb</failure></testcase>'
        '<testcase classname="tests.test_x" name="test_skip"><skipped/></testcase>'
        "</testsuite></testsuites>")
    counts = results.junit(xml)
    assert (counts["passed"], counts["failures"], counts["skipped"]) == (1, 1, 1)
    assert counts["failed"] == [{"test": "tests.test_x::test_bad", "outcome": "failure", "message": "assert 1 == 2"}]


def test_the_summary_has_a_section_per_result_and_survives_a_malformed_one(tmp_path):
    found = tmp_path / "results"
    found.mkdir()
    (found / "steps.json").write_text(json.dumps({"build": {"state": "ok", "seconds": 300}}))
    (found / "plain-gemma.json").write_text(json.dumps({"tools": {
        "llama.cpp plain": {"median_tokens_per_second": 400.0}, "specli plain": {"median_tokens_per_second": 250.0}}}))
    (found / "tests.json").write_text(json.dumps({"unexpected": True}))
    results.summary(found, tmp_path / "out")
    text = (tmp_path / "out" / "summary.md").read_text()
    assert "| build | ok | 300 |" in text
    # 2.5 ms against 4.0 ms a token: specli's extra 1.5 ms is 37.5% of its token.
    assert "| gemma | 400.0 | 250.0 | 2.500 | 4.000 | 1.500 | 37.5% |" in text
    assert "could not read the results" in text
    assert json.loads((tmp_path / "out" / "results.json").read_text())["steps"]["build"]["seconds"] == 300


def test_the_summary_compares_mtp_at_the_same_depth_and_at_each_side_s_best(tmp_path):
    found = tmp_path / "results"
    found.mkdir()
    tools = {"llama.cpp": {"median_tokens_per_second": 80.0}, "specli": {"median_tokens_per_second": 100.0}}
    for name, k in (("mtp-same-k2", 2), ("mtp-compare", 3)):
        (found / f"{name}.json").write_text(json.dumps({"workload": {"k": k, "draft": "mtp"}, "tools": tools}))
    results.summary(found, tmp_path / "out")
    text = (tmp_path / "out" / "summary.md").read_text()
    assert "## (e) MTP" in text and "| same depth, MTP alone | K=2 | 80.0 | 100.0 |" in text
    assert "| each at its best (specli -k auto) | K=3 |" in text


def test_the_summary_tables_each_pairs_clients_at_once(tmp_path):
    found = tmp_path / "results"
    found.mkdir()
    figures = {"aggregate": 250.0, "over_it": 1.25, "request_p50": 60.0, "first_p50": 0.2, "rows_per_step": 2.5}
    report = {"16": {"specli --parallel 16": figures, "llama-server -np 16 --spec-type draft-mtp": figures}}
    (found / "parallel-mtp.json").write_text(json.dumps(report))
    results.summary(found, tmp_path / "out")
    text = (tmp_path / "out" / "summary.md").read_text()
    assert "## (f) the Qwen3.5, its NextN layer in every slot" in text and "parallel-draft" not in text
    assert "| 16 | llama-server -np 16 --spec-type draft-mtp | 250.0 | 1.25 | 60.0 | 0.20 | 2.50 |" in text
