"""What a hybrid target's caches take in specli and in llama.cpp, decoding plainly, with n-gram
lookup and with MTP: the attention cache and the recurrent states each allocates for the same
file, as llama.cpp logs them as it creates the context (`llama_kv_cache: size`,
`llama_memory_recurrent: size`; specli reads the same lines: `run --json`'s `memory`).

    python benchmarks/recurrent_memory.py --llama-bin benchmarks/out/llama.cpp-src/build/bin
    python benchmarks/recurrent_memory.py --llama-bin DIR --target Qwen3.6-27B-Q4_K_M.gguf

Without --target it writes a synthetic Qwen3.5 as the converter lays it out (6 gated-delta-net
layers of 16 value heads of 128, 2 attention layers, one MTP block; n_embd 1024). Sides, each
with `-c 4096`: `specli run --draft none | ngram | mtp` (-k auto) against `llama-completion`
and `llama-speculative-simple --spec-type ngram-simple | draft-mtp` (their defaults). The host
copies of the state (specli's chat and serve checkpoints, llama.cpp's speculative checkpoint for
lookup) are one state each, the RS buffer of a plain load.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's packages
from tests.support.synthetic_mtp import HybridSpec, write_tiny_hybrid  # noqa: E402

PROMPT = "The quick brown fox jumps over the lazy dog. Then"
SHAPE = HybridSpec(n_embd=1024, n_layer=8, n_head=8, n_head_kv=2, n_ff=2048, ssm_heads=8, ssm_v_heads=16,
                   ssm_head_dim=128, tied=True, shared_head_norm=True, context_length=8192)
BUFFER = re.compile(rb"(llama_kv_cache|llama_memory_recurrent): size =\s*([0-9.]+) MiB")


def specli_memory(target: Path, draft: str) -> dict[str, float]:
    result = subprocess.run([sys.executable, "-m", "specli", "run", "--target", str(target), "--no-chat", "-c", "4096",
                             "-n", "8", "--draft", draft, "--json", PROMPT], capture_output=True, timeout=600)
    stats = json.loads(result.stdout.decode().strip().splitlines()[-1])
    memory = stats["memory"]
    return {"KV": memory.get("kv_cache_bytes", 0) / 2**20, "RS": memory.get("recurrent_bytes", 0) / 2**20,
            "snapshots": memory.get("recurrent_snapshots", 0)}


def llama_memory(binary: Path, target: Path, *args: str) -> dict[str, float]:
    """The KV and RS buffers the target's context takes (the first context llama.cpp creates)."""
    result = subprocess.run([str(binary), "-v", "-m", str(target), "-c", "4096", "-n", "8", "-p", PROMPT, "--temp", "0",
                             *args], capture_output=True, timeout=600, stdin=subprocess.DEVNULL)
    sizes: dict[str, float] = {}
    for kind, mib in BUFFER.findall(result.stdout + result.stderr):
        sizes.setdefault("KV" if kind == b"llama_kv_cache" else "RS", float(mib))  # the target's context comes first
    if not sizes:
        raise SystemExit(f"{binary.name} {' '.join(args)}: no buffer sizes in its log (exit {result.returncode})")
    return sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-bin", type=Path, required=True, help="Where llama-completion and llama-speculative-simple are.")
    parser.add_argument("--target", type=Path, help="A hybrid GGUF with its MTP layer (default: a synthetic Qwen3.5).")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        target = args.target or write_tiny_hybrid(folder, SHAPE, name="qwen35-memory.gguf")
        rows = [("plain", specli_memory(target, "none"), llama_memory(args.llama_bin / "llama-completion", target, "-no-cnv")),
                ("n-gram", specli_memory(target, "ngram"),
                 llama_memory(args.llama_bin / "llama-speculative-simple", target, "--spec-type", "ngram-simple")),
                ("MTP", specli_memory(target, "mtp"),
                 llama_memory(args.llama_bin / "llama-speculative-simple", target, "--spec-type", "draft-mtp"))]
    state = rows[0][1]["RS"]
    print(f"one state: {state:.2f} MiB")
    # host copies: specli's chat and serve checkpoints; llama-server's context checkpoints (its
    # --ctx-checkpoints, 32) and, drafting with lookup, one more before each verify
    print("| decoding | specli RS (snapshots) | llama.cpp RS | KV specli / llama.cpp | states on the host, specli / llama-server |")
    print("| --- | --- | --- | --- | --- |")
    for name, ours, theirs in rows:
        host_theirs = "≤ 32 + 1 a verify" if name == "n-gram" else "≤ 32"
        print(f"| {name} | {ours['RS']:.2f} MiB ({ours['snapshots']:.0f}) | {theirs.get('RS', 0):.2f} MiB | "
              f"{ours['KV']:.1f} / {theirs.get('KV', 0):.1f} MiB | ≤ 4 / {host_theirs} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
