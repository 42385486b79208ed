"""What the tests and the benchmarks share, imported by both as `tests.support.*`:

- `synthetic`, `synthetic_mtp`: random-weight GGUF writers with a real tokenizer (prefix pairs,
  mismatched vocabularies, NextN layers, a hybrid recurrent trunk); their command lines are
  benchmarks/synthetic.py and benchmarks/synthetic_mtp.py;
- `rpc_server`: llama.cpp's ggml-rpc-server, built once from the vendored sources and started on
  a free loopback port;
- `harness`: a free port, a server process waited for until /health answers, and stopped.

Nothing here imports a test module or a benchmark script."""
