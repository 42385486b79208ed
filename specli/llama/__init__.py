"""llama.cpp: the binding (`backend`, the only importer of llama_cpp), its devices and RPC
servers, GGUF headers, the vocabulary rule and chat templates."""
