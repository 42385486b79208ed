"""specli: local speculative generation with llama.cpp."""

# llama.cpp's shared libraries load before anything imports numpy. On a CUDA build of
# llama-cpp-python 0.3.36 (H200 machine, 2026-11-26), numpy imported first made every model
# load segfault, CPU-only layers too; with llama.cpp loaded first the same processes ran.
from specli.llama import backend as _backend  # noqa: F401, I001  (first, on purpose)

__version__ = "0.1.0"
