"""How to (re)install llama-cpp-python for a GPU, RPC or more CPU features: the commands specli
suggests, in one place (a leaf: it imports nothing of specli's). The README's GPU table prints
the same commands; tests/test_boundaries.py holds the two together."""

from __future__ import annotations

PIP_REINSTALL = "pip install --force-reinstall --no-cache-dir llama-cpp-python"
# Every reinstall specli suggests keeps RPC (--rpc), as README's install does.
GPU_INSTALL = {
    "cuda": f'CMAKE_ARGS="-DGGML_CUDA=on -DGGML_RPC=ON" {PIP_REINSTALL}',
    "metal": f'CMAKE_ARGS="-DGGML_METAL=on -DGGML_RPC=ON" {PIP_REINSTALL}',
}
RPC_INSTALL = f'CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_RPC=ON" {PIP_REINSTALL}'
GPU_INSTALL_HINT = (
    f"for an NVIDIA GPU reinstall llama-cpp-python with CUDA: {GPU_INSTALL['cuda']}; "
    f"on a Mac with Metal: {GPU_INSTALL['metal']}"
)
# x86 instruction sets that ggml has CPU kernels for: the name in /proc/cpuinfo's flags, in
# llama.cpp's system info, and the CMake option that builds for it. `-DGGML_NATIVE=OFF` (the
# portable build, which also avoids a crash in the AMX path on some CPUs) stops at
# AVX2/FMA/F16C: on a CPU with AVX-512 the batched verify then runs slower kernels
# (docs/design.md, "Other defaults").
CPU_FEATURES = (
    ("avx2", "AVX2", "GGML_AVX2"),
    ("fma", "FMA", "GGML_FMA"),
    ("f16c", "F16C", "GGML_F16C"),
    ("avx_vnni", "AVX_VNNI", "GGML_AVX_VNNI"),
    ("avx512f", "AVX512", "GGML_AVX512"),
    ("avx512vbmi", "AVX512_VBMI", "GGML_AVX512_VBMI"),
    ("avx512_vnni", "AVX512_VNNI", "GGML_AVX512_VNNI"),
    ("avx512_bf16", "AVX512_BF16", "GGML_AVX512_BF16"),
)


def cpu_install_command(unused: list[tuple[str, str]]) -> str:
    """The reinstall that builds the CPU kernels for these (llama.cpp name, CMake option) pairs."""
    options = " ".join(f"-D{option}=ON" for _, option in unused)
    return f'CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_RPC=ON {options}" {PIP_REINSTALL}'
