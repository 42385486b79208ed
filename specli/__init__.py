"""specli: local speculative generation with llama.cpp."""

# llama.cpp's shared libraries load before anything imports numpy: on a CUDA build, numpy
# loaded first can make every model load crash (specli.llama.backend._warn_import_order).
from specli.llama import backend as _backend  # noqa: F401, I001  (first, on purpose)

__version__ = "0.1.0"
