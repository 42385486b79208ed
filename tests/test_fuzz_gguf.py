"""Random bytes, truncations and mutations of a small GGUF: refused in one line, never a crash.

A crash inside llama.cpp (an abort, a segfault) would end the process with a signal, so
the files go through `specli run` in a subprocess; a larger batch goes through the
header check in-process.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specli.errors import ModelFileError
from specli.llama.backend import check_gguf_file

gguf = pytest.importorskip("gguf")

N_EMBD, N_HEAD, N_HEAD_KV, N_FF, N_CTX = 16, 2, 1, 32, 64


def write_tiny_model(path: Path, *, extra: dict | None = None, replace_tokens: dict[int, str] | None = None) -> Path:
    """A one-layer llama with a 300-token SentencePiece vocabulary: about 60 kB, a header
    of a few kB, and it loads and generates in llama.cpp. `extra`: key -> (value, GGUF
    value type), added or overriding; `replace_tokens`: token id -> new text."""
    words = [f"\u2581w{i}" for i in range(41)]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + words
    for token, text in (replace_tokens or {}).items():
        tokens[token] = text
    types = [2, 3, 3] + [6] * 256 + [1] * len(words)  # unknown, control, byte, normal
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name("fuzz")
    writer.add_context_length(N_CTX)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(1)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([-float(i) for i in range(len(tokens))])
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    for key, (value, value_type) in (extra or {}).items():
        writer.add_key_value(key, value, value_type)
    rng = np.random.default_rng(0)
    kv = N_HEAD_KV * (N_EMBD // N_HEAD)
    shapes = {
        "token_embd.weight": (len(tokens), N_EMBD),
        "blk.0.attn_norm.weight": (N_EMBD,),
        "blk.0.attn_q.weight": (N_EMBD, N_EMBD),
        "blk.0.attn_k.weight": (kv, N_EMBD),
        "blk.0.attn_v.weight": (kv, N_EMBD),
        "blk.0.attn_output.weight": (N_EMBD, N_EMBD),
        "blk.0.ffn_norm.weight": (N_EMBD,),
        "blk.0.ffn_gate.weight": (N_FF, N_EMBD),
        "blk.0.ffn_up.weight": (N_FF, N_EMBD),
        "blk.0.ffn_down.weight": (N_EMBD, N_FF),
        "output_norm.weight": (N_EMBD,),
        "output.weight": (len(tokens), N_EMBD),
    }
    for name, shape in shapes.items():
        values = np.ones(shape, np.float32) if len(shape) == 1 else rng.standard_normal(shape).astype(np.float32) * 0.2
        writer.add_tensor(name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# --- the mutations -------------------------------------------------------------

INTERESTING = (0, 1, 2, 3, 7, 8, 0x7F, 0x80, 0xFF, 0x100, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF,
               2**63 - 1, 2**63, 2**64 - 1)


def structural_fields(path: Path) -> list[tuple[int, int]]:
    """(offset, size) of every number in the header: lengths, types, counts, dimensions,
    offsets and scalar values; string bytes are left out."""
    reader = gguf.GGUFReader(path)
    fields = list(reader.fields.values()) + [tensor.field for tensor in reader.tensors]
    found = []
    for field in fields:
        offset = field.offset
        for part in field.parts:
            if part.dtype != np.uint8 or part.size == 1:  # uint8 runs are string bytes
                found.extend((offset + i * part.itemsize, part.itemsize) for i in range(min(part.size, 4)))
            offset += part.nbytes
    return found


def mutate(data: bytes, fields: list[tuple[int, int]], header_end: int, rng: random.Random) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        if rng.random() < 0.7:
            offset, size = rng.choice(fields)
            value = rng.choice(INTERESTING) if rng.random() < 0.7 else rng.getrandbits(8 * size)
            value += rng.choice((0, 0, 1, -1)) if 0 < value < 2 ** (8 * size) - 1 else 0
            out[offset : offset + size] = (value % 2 ** (8 * size)).to_bytes(size, "little")
        else:
            offset = rng.randrange(header_end)
            out[offset] ^= 1 << rng.randrange(8)
    return bytes(out)


@pytest.fixture(scope="module")
def base_model(tmp_path_factory) -> tuple[bytes, list[tuple[int, int]], int]:
    from specli.llama.gguf_header import read_header

    path = write_tiny_model(tmp_path_factory.mktemp("fuzz") / "tiny.gguf")
    return path.read_bytes(), structural_fields(path), read_header(path).data_start


def subprocess_cases(base_model) -> list[tuple[str, bytes, bool]]:
    """(name, file contents, must be refused) — about thirty files, the same on every run."""
    data, fields, header_end = base_model
    rng = random.Random(20240601)
    cases = []
    for size in (0, 3, 24, 100, 5000):
        cases.append((f"random-{size}", rng.randbytes(size), True))
    for size in (30, 200, 3000):
        cases.append((f"magic-then-random-{size}", b"GGUF" + (3).to_bytes(4, "little") + rng.randbytes(size), True))
    for cut in (4, 12, 24, 200, header_end // 2, header_end - 1, header_end, header_end + 100, len(data) - 1):
        cases.append((f"truncated-at-{cut}", data[:cut], True))
    for index in range(15):
        cases.append((f"mutation-{index}", mutate(data, fields, header_end, rng), False))
    return cases


def run_target(path: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "specli", "run", "--target", str(path), "--no-chat", "-n", "2", "-k", "4",
               "--ctx-size", "64", "hello"]
    return subprocess.run(command, capture_output=True, stdin=subprocess.DEVNULL, timeout=300, env=dict(os.environ))


@pytest.mark.slow
def test_the_tiny_model_itself_runs(base_model, tmp_path):
    path = tmp_path / "tiny.gguf"
    path.write_bytes(base_model[0])
    result = run_target(path)
    assert result.returncode == 0, result.stderr.decode()


@pytest.mark.slow
def test_broken_files_end_in_one_line_never_a_crash(base_model, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    cases = subprocess_cases(base_model)
    paths = []
    for name, contents, _ in cases:
        path = tmp_path / f"{name}.gguf"
        path.write_bytes(contents)
        paths.append(path)
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(run_target, paths))
    failures = []
    for (name, _, must_refuse), result in zip(cases, results):
        err = result.stderr.decode("utf-8", "replace")
        allowed = {1} if must_refuse else {0, 1}
        one_line = result.returncode == 0 or (err.count("\n") == 1 and err.startswith("specli: error: "))
        if result.returncode not in allowed or "Traceback" in err or not one_line:
            failures.append(f"{name}: exit {result.returncode}: {err[-500:]}")
    assert not failures, "\n".join(failures)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_the_header_check_only_ever_raises_model_file_error(base_model, tmp_path, data):
    contents, fields, header_end = base_model
    kind = data.draw(st.sampled_from(["truncate", "mutate", "random", "splice"]))
    if kind == "truncate":
        broken = contents[: data.draw(st.integers(0, len(contents)))]
    elif kind == "mutate":
        broken = mutate(contents, fields, header_end, random.Random(data.draw(st.integers(0, 2**32))))
    elif kind == "random":
        broken = data.draw(st.binary(max_size=2000))
    else:  # a valid start followed by anything
        broken = contents[: data.draw(st.integers(0, header_end))] + data.draw(st.binary(max_size=200))
    path = tmp_path / "case.gguf"
    path.write_bytes(broken)
    try:
        check_gguf_file(path)
    except ModelFileError as error:
        assert "\n" not in error.message and str(path) in error.message


U32 = gguf.GGUFValueType.UINT32


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, options, message",
    [
        ("alignment", {"extra": {"general.alignment": (32, gguf.GGUFValueType.UINT8)}}, "general.alignment has type uint8"),
        ("layers", {"extra": {"llama.block_count": (600, U32)}}, "llama.block_count is 600 (1 to 512 layers allowed)"),
        ("experts", {"extra": {"llama.expert_count": (4, U32), "llama.expert_used_count": (5, U32)}},
         "llama.expert_used_count is 5 for 4 experts"),
        ("duplicate-token", {"replace_tokens": {299: "\u2581w39"}}, "tokens 298 and 299 of tokenizer.ggml.tokens are both"),
        ("no-byte-token", {"replace_tokens": {3 + 0x41: "\u2581A"}}, "no token for byte 0x41"),
    ],
)
def test_what_llama_cpp_would_abort_on_is_refused_first(tmp_path, name, options, message):
    """llama.cpp aborts the whole process on most of these (an assert in its model or
    vocabulary loader, or an uncaught exception when a prompt needs the missing byte
    token); specli refuses them first, in one line."""
    path = write_tiny_model(tmp_path / f"{name}.gguf", **options)
    with pytest.raises(ModelFileError) as caught:
        check_gguf_file(path)
    assert message in caught.value.message
    result = run_target(path)
    assert result.returncode == 1
    assert result.stderr.decode().startswith("specli: error: ") and message in result.stderr.decode()


def test_a_header_is_parsed_again_once_its_file_changes(tmp_path):
    """read_header hands a settled file's header out again (a command asks several times),
    and parses anew a file rewritten in place, or one written within the last second (whose
    rewrite could keep size and modification time)."""
    from specli.llama.gguf_header import read_header

    path = write_tiny_model(tmp_path / "model.gguf")
    fresh = read_header(path)
    assert read_header(path) is not fresh  # written just now: not trusted yet
    settled = os.stat(path).st_mtime_ns - 5_000_000_000
    os.utime(path, ns=(settled, settled))
    kept = read_header(path)
    assert read_header(path) is kept and kept.metadata == fresh.metadata
    data = bytearray(path.read_bytes())
    data[4:8] = (99).to_bytes(4, "little")  # an unknown version, the same size, in place
    with path.open("r+b") as handle:
        handle.write(data)
    with pytest.raises(ModelFileError, match="version"):
        read_header(path)
