#!/usr/bin/env bash
# Build llama.cpp's speculative-decoding tools from the very llama.cpp that the
# installed llama-cpp-python vendors, so both sides of a comparison run the
# same kernels.
#
# Usage: benchmarks/build_llama_cpp.sh [WORK_DIR]
#
#   WORK_DIR   where the sdist is downloaded, extracted and built
#              (default: benchmarks/out/llama.cpp-src, git-ignored)
#
# Environment:
#   PYTHON        interpreter whose llama-cpp-python version is matched
#                 (default: python3 on PATH)
#   LLAMA_CPP_PYTHON_VERSION   build this version instead of the installed one
#   SOURCE_DIR    an extracted llama-cpp-python sdist to build from, offline (no
#                 download; PYTHON and LLAMA_CPP_PYTHON_VERSION are then unused)
#   CMAKE_ARGS    extra CMake flags, appended last, e.g. "-DGGML_CUDA=on"
#   JOBS          parallel compile jobs (default: number of CPUs)
#   TARGETS       CMake targets (default: llama-speculative-simple llama-completion llama-simple)
#
# Prints the path of each built binary on stdout; progress goes to stderr.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work_dir="${1:-$repo_root/benchmarks/out/llama.cpp-src}"
python="${PYTHON:-python3}"
jobs="${JOBS:-$(nproc 2>/dev/null || echo 2)}"
targets="${TARGETS:-llama-speculative-simple llama-completion llama-simple}"

log() { echo "build_llama_cpp: $*" >&2; }

version="${LLAMA_CPP_PYTHON_VERSION:-}"
if [[ -n "${SOURCE_DIR:-}" ]]; then
    version="$(sed -n 's/^__version__ = "\(.*\)"/\1/p' "$SOURCE_DIR/llama_cpp/__init__.py")"
    if [[ -z "$version" || ! -f "$SOURCE_DIR/vendor/llama.cpp/CMakeLists.txt" ]]; then
        log "SOURCE_DIR=$SOURCE_DIR is not an extracted llama-cpp-python sdist"
        exit 1
    fi
elif [[ -z "$version" ]]; then
    if ! version="$("$python" -c 'import llama_cpp; print(llama_cpp.__version__)' 2>/dev/null)"; then
        log "cannot import llama_cpp with $python; set PYTHON=/path/to/venv/bin/python or LLAMA_CPP_PYTHON_VERSION"
        exit 1
    fi
fi
log "llama-cpp-python $version"

mkdir -p "$work_dir"
work_dir="$(cd "$work_dir" && pwd)"
sdist="$work_dir/llama_cpp_python-$version.tar.gz"
src="${SOURCE_DIR:-$work_dir/llama_cpp_python-$version}"
llama_src="$src/vendor/llama.cpp"
# One build folder per version and CMAKE_ARGS, so a CUDA build never reuses a CPU cache.
build="$work_dir/build-$version"
if [[ -n "${CMAKE_ARGS:-}" ]]; then
    build="$build-$(printf '%s' "$CMAKE_ARGS" | cksum | cut -d' ' -f1)"
fi

if [[ -z "${SOURCE_DIR:-}" && ! -f "$sdist" ]]; then
    log "downloading the sdist into $work_dir"
    "$python" -m pip download --quiet --no-deps --no-binary :all: \
        "llama-cpp-python==$version" -d "$work_dir" >&2
fi

if [[ ! -f "$llama_src/CMakeLists.txt" ]]; then
    log "extracting $sdist"
    tar -xzf "$sdist" -C "$work_dir"
fi

# GGML_NATIVE=OFF: the same portable instruction set (AVX2/FMA/F16C, no
# -march=native) that `CMAKE_ARGS=-DGGML_NATIVE=OFF pip install` gives the
# Python side; -march=native also crashes in the AMX path on some CPUs.
# Static libraries keep the binaries independent of the build folder.
# shellcheck disable=SC2086  # CMAKE_ARGS is a list of flags
cmake -S "$llama_src" -B "$build" \
    -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=OFF \
    -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_COMMON=ON \
    -DLLAMA_BUILD_EXAMPLES=ON \
    -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_SERVER="$([[ " $targets " == *" llama-server "* ]] && echo ON || echo OFF)" \
    -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_OPENSSL=OFF \
    ${CMAKE_ARGS:-} >&2

# shellcheck disable=SC2086  # targets is a list
cmake --build "$build" --config Release -j "$jobs" --target $targets >&2

for target in $targets; do
    binary="$build/bin/$target"
    if [[ ! -x "$binary" ]]; then
        log "expected $binary after the build"
        exit 1
    fi
    echo "$binary"
done
