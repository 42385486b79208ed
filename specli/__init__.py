"""specli: local speculative generation with llama.cpp."""

__version__ = "0.1.0"
