"""Synthetic MiMo-2 GGUF models with NextN (multi-token prediction) layers, for tests and benchmarks.

MiMo-2 is the simplest architecture this llama.cpp drafts with through its NextN layers: a
dense trunk (every layer's feed-forward may be plain SwiGLU), an attention-only cache
(full and sliding-window layers), and NextN blocks that are ordinary decoder blocks
behind a projection of [embedding of the token; the trunk's hidden state].

The tokenizer is a real one, copied as in `tests.support.synthetic` (SmolLM2's by default).
The weights are made so that the next token is predictable, and the NextN head predicts it
too, most of the time:

- a successor map `following` chains every ordinary token into one cycle; the output head's row
  for `following[x]` is token x's embedding (scaled), so a hidden state close to x's embedding
  writes `following[x]`;
- the trunk's blocks add context-dependent terms of RMS about `trunk_scale` to the residual
  stream, so where they outweigh the margin the trunk writes another token;
- each NextN block projects `e + hidden_weight * h` (its `eh_proj` is [I, hidden_weight * I])
  and adds terms of RMS about `head_scale`: it predicts `following[t]` for the token t it reads,
  which is the trunk's choice wherever the trunk did not deviate.

With `head_scale` 0 a NextN block adds nothing (its attention and feed-forward outputs are zero),
so its logits are a closed form of its inputs (`head_logits`), which tests check the binding
against. Every tensor's values are a pure function of (seed, tensor name).

The command line that writes them is benchmarks/synthetic_mtp.py.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import zlib
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import gguf
import numpy as np
from gguf import GGUFValueType

from tests.support.synthetic import Vocabulary, load_vocabulary

ARCH = "mimo2"
NORMAL_TOKEN = 1  # tokenizer.ggml.token_type of an ordinary token (gguf.TokenType.NORMAL)


@dataclasses.dataclass(frozen=True)
class MtpSpec:
    """A MiMo-2 trunk of `n_layer` dense blocks and `n_nextn` NextN blocks after it."""

    n_layer: int
    n_nextn: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    sliding_window: int = 64
    trunk_scale: float = 0.55  # RMS of what each trunk block adds, against unit-RMS embeddings
    head_scale: float = 0.1  # the same for each NextN block (0: it adds nothing)
    hidden_weight: float = 0.5  # the share of the trunk's hidden state in a NextN block's input
    logit_scale: float = 2.0  # the preferred token's logit is about logit_scale * sqrt(n_embd)
    context_length: int = 2048
    dtype: str = "f32"
    # A head that needs the right state at the right position: its block reads the trunk's
    # hidden state alone (eh_proj's embedding half is zero) and writes through a head of its
    # own (nextn.shared_head_head) whose row following[following[x]] is x's embedding. Entry q
    # reads (token q, the state at q - 1, which holds token q - 1), so it predicts the token two
    # after q - 1, the one after q; a state one position off, or zeros, predicts another.
    wiring: bool = False

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def n_qkv(self) -> int:
        return self.n_embd + 2 * self.n_head_kv * self.head_dim

    def sliding_layers(self) -> list[int]:
        """1 for a sliding-window layer: the first trunk layer attends fully, the rest and
        every NextN block (as MiMo-2's converter writes them) within the window."""
        return [0] + [1] * (self.n_layer - 1) + [1] * self.n_nextn

    def tensors(self, n_vocab: int, nextn: bool = True) -> list[tuple[str, tuple[int, ...]]]:
        """(name, numpy shape) of every tensor, in file order (`nextn` False: the trunk's only)."""
        d = self.n_embd
        names = [("token_embd.weight", (n_vocab, d))]
        for i in range(self.n_layer + (self.n_nextn if nextn else 0)):
            names += [
                (f"blk.{i}.attn_norm.weight", (d,)),
                (f"blk.{i}.attn_qkv.weight", (self.n_qkv, d)),
                (f"blk.{i}.attn_output.weight", (d, d)),
                (f"blk.{i}.ffn_norm.weight", (d,)),
                (f"blk.{i}.ffn_gate.weight", (self.n_ff, d)),
                (f"blk.{i}.ffn_up.weight", (self.n_ff, d)),
                (f"blk.{i}.ffn_down.weight", (d, self.n_ff)),
            ]
            if i >= self.n_layer:
                names += [
                    (f"blk.{i}.nextn.eh_proj.weight", (d, 2 * d)),
                    (f"blk.{i}.nextn.enorm.weight", (d,)),
                    (f"blk.{i}.nextn.hnorm.weight", (d,)),
                ]
                if self.wiring:
                    names += [(f"blk.{i}.nextn.shared_head_head.weight", (n_vocab, d))]
        names += [("output_norm.weight", (d,)), ("output.weight", (n_vocab, d))]
        return names


# Drafts mostly kept and sometimes rejected (figures: benchmarks/README.md, "Synthetic models").
TINY_MTP = MtpSpec(n_layer=2, n_nextn=1, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, trunk_scale=0.55)
# Llama 3 8B's trunk (with Llama 3's vocabulary: 8.0B parameters) and one NextN block, in F16:
# a memory-bound target for a GPU, drafting at any depth with its one layer as llama.cpp does.
MIMO_8B = MtpSpec(n_layer=32, n_nextn=1, n_embd=4096, n_head=32, n_head_kv=8, n_ff=14336, sliding_window=128,
                  trunk_scale=0.25, head_scale=0.1, context_length=4096, dtype="f16")
SHAPES = {"tiny": TINY_MTP, "8b": MIMO_8B}


def ordinary_tokens(vocab: Vocabulary) -> np.ndarray:
    """The ids of the ordinary tokens (not control, byte or unused ones)."""
    return np.flatnonzero(np.asarray(vocab.fields["tokenizer.ggml.token_type"].value) == NORMAL_TOKEN)


def following_tokens(vocab: Vocabulary, seed: int) -> np.ndarray:
    """Each token's successor: the ordinary tokens in one random cycle; every other token
    is followed by the cycle's first token."""
    ordinary = ordinary_tokens(vocab)
    order = np.random.default_rng([seed, zlib.crc32(b"following")]).permutation(ordinary)
    following = np.full(vocab.n_tokens, order[0], dtype=np.int64)
    following[order] = np.roll(order, -1)
    return following


def _random(name: str, shape: tuple[int, ...], seed: int, std: float) -> np.ndarray:
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    values = rng.standard_normal(shape, dtype=np.float32)
    values *= std
    return values


def _embeddings(n_vocab: int, spec: MtpSpec, seed: int) -> np.ndarray:
    return _random("token_embd.weight", (n_vocab, spec.n_embd), seed, 1.0)  # unit-RMS rows


def _output_head(embeddings: np.ndarray, vocab: Vocabulary, logit_scale: float, seed: int,
                 steps: int = 1) -> np.ndarray:
    """Row following[x] (`steps` 2: following[following[x]]) is x's embedding, scaled, for every
    ordinary token x; the rows of the other tokens are zero."""
    head = np.zeros_like(embeddings)
    ordinary, following = ordinary_tokens(vocab), following_tokens(vocab, seed)
    ahead = following[following[ordinary]] if steps == 2 else following[ordinary]
    head[ahead] = embeddings[ordinary] * (logit_scale / np.sqrt(embeddings.shape[1]))
    return head


def _block_values(name: str, shape: tuple[int, ...], spec: MtpSpec, seed: int) -> np.ndarray:
    """A block's tensor: unit norms, random projections whose outputs add terms of the
    block's scale (trunk or head) to the residual stream, and the NextN input projection."""
    if len(shape) == 1:
        return np.ones(shape, dtype=np.float32)
    layer = int(name.split(".")[1])
    if name.endswith("nextn.eh_proj.weight"):
        d = spec.n_embd
        embedding = np.zeros((d, d), dtype=np.float32) if spec.wiring else np.eye(d, dtype=np.float32)
        return np.hstack([embedding, (1.0 if spec.wiring else spec.hidden_weight) * np.eye(d, dtype=np.float32)])
    scale = spec.trunk_scale if layer < spec.n_layer else spec.head_scale
    std = 1.0 / np.sqrt(shape[1])
    if name.endswith(("attn_output.weight", "ffn_down.weight")):
        # attention's output has RMS about 1/sqrt(n_head_kv) of a value row; SwiGLU's about 0.5
        std *= scale * (2.0 if name.endswith("ffn_down.weight") else 1.0)
        if scale == 0.0:
            return np.zeros(shape, dtype=np.float32)
    return _random(name, shape, seed, std)


def _write_header(writer: gguf.GGUFWriter, spec: MtpSpec, vocab: Vocabulary, name: str) -> None:
    def put(key: str, value: object, kind: GGUFValueType, sub: GGUFValueType | None = None) -> None:
        writer.add_key_value(f"{ARCH}.{key}", value, kind, sub)

    u32, f32 = GGUFValueType.UINT32, GGUFValueType.FLOAT32
    writer.add_name(name)
    put("context_length", spec.context_length, u32)
    put("embedding_length", spec.n_embd, u32)
    put("block_count", spec.n_layer + spec.n_nextn, u32)
    put("nextn_predict_layers", spec.n_nextn, u32)
    put("feed_forward_length", spec.n_ff, u32)
    put("expert_feed_forward_length", spec.n_ff, u32)  # required by the loader; no experts here
    put("attention.head_count", spec.n_head, u32)
    put("attention.head_count_kv", spec.n_head_kv, u32)
    put("attention.layer_norm_rms_epsilon", 1e-6, f32)
    put("attention.sliding_window", spec.sliding_window, u32)
    put("attention.sliding_window_pattern", spec.sliding_layers(), GGUFValueType.ARRAY, GGUFValueType.INT32)
    put("rope.dimension_count", spec.head_dim, u32)
    put("rope.freq_base", 10000.0, f32)
    put("vocab_size", vocab.n_tokens, u32)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if spec.dtype == "f16" else gguf.LlamaFileType.ALL_F32)
    for key, field in vocab.fields.items():
        writer.add_key_value(key, field.value, field.type, field.sub_type)


def write_mtp_model(
    path: str | os.PathLike[str],
    spec: MtpSpec = TINY_MTP,
    *,
    vocab: Vocabulary | str | os.PathLike[str] | None = None,
    seed: int = 0,
    name: str = "specli-synthetic-mtp",
    trunk_only: bool = False,
    sidecar: bool = False,
    workers: int = 1,
) -> Path:
    """Write a MiMo-2 GGUF with `spec.n_nextn` NextN blocks and a real tokenizer; return its
    path. `trunk_only`: the blocks are declared but their tensors left out, as in a GGUF whose
    NextN layers ship in a separate MTP file; `sidecar`: that file (the same header, the
    embeddings, output head and NextN blocks, no trunk block), as llama.cpp's converter writes
    `mtp-*.gguf` beside the trunk (the same seed gives the trunk-only file's weights).
    `workers` > 1: that many threads make the next tensors while earlier ones are written (the
    same file)."""
    if not isinstance(vocab, Vocabulary):
        vocab = load_vocabulary(vocab)
    if spec.n_embd % spec.n_head or spec.n_head % spec.n_head_kv:
        raise ValueError("n_embd must be a multiple of n_head, and n_head of n_head_kv")
    matrix_dtype = np.dtype(np.float16 if spec.dtype == "f16" else np.float32)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    writer = gguf.GGUFWriter(partial, ARCH)
    _write_header(writer, spec, vocab, name)
    tensors = spec.tensors(vocab.n_tokens, nextn=not trunk_only)
    if sidecar:
        tensors = [(n, shape) for n, shape in tensors if not n.startswith("blk.") or int(n.split(".")[1]) >= spec.n_layer]
    for tensor_name, shape in tensors:
        item = np.dtype(np.float32) if len(shape) == 1 else matrix_dtype
        writer.add_tensor_info(tensor_name, shape, item, int(np.prod(shape)) * item.itemsize)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    embeddings = _embeddings(vocab.n_tokens, spec, seed)

    def values(tensor: tuple[str, tuple[int, ...]]) -> np.ndarray:
        tensor_name, shape = tensor
        if tensor_name == "token_embd.weight":
            made = embeddings
        elif tensor_name == "output.weight":
            made = _output_head(embeddings, vocab, spec.logit_scale, seed)
        elif tensor_name.endswith("nextn.shared_head_head.weight"):
            made = _output_head(embeddings, vocab, spec.logit_scale, seed, steps=2)
        else:
            made = _block_values(tensor_name, shape, spec, seed)
        return made.astype(np.float32 if len(shape) == 1 else matrix_dtype, copy=False)

    return _write_in_order(writer, tensors, values, workers, partial, path)


def _write_in_order(writer: gguf.GGUFWriter, tensors: list[tuple[str, tuple[int, ...]]], made: Callable,
                    workers: int, partial: Path, path: Path) -> Path:
    """Each tensor's data, `made(tensor)`, written in file order while `workers` threads make the
    next ones (a bounded look-ahead); the finished file moved from `partial` to `path`."""
    with ThreadPoolExecutor(max(1, workers)) as pool:
        pending: deque = deque()
        for tensor in tensors:
            pending.append(pool.submit(made, tensor))
            if len(pending) >= 2 * max(1, workers):
                writer.write_tensor_data(pending.popleft().result())
        while pending:
            writer.write_tensor_data(pending.popleft().result())
    writer.close()
    partial.replace(path)
    return path


def write_tiny_mtp(out_dir: str | os.PathLike[str], *, heads: int = 1, head_scale: float | None = None,
                   seed: int = 0) -> Path:
    """A tiny MiMo-2 (2 trunk layers of n_embd 64, SmolLM2's vocabulary, about 26 MB in F32)
    with `heads` NextN blocks; `head_scale` 0 makes them add nothing (see `head_logits`)."""
    spec = dataclasses.replace(TINY_MTP, n_nextn=heads,
                               **({} if head_scale is None else {"head_scale": head_scale}))
    scale = "" if head_scale is None else f"-h{head_scale:g}"
    return write_mtp_model(Path(out_dir) / f"tiny-mtp{heads}{scale}-s{seed}.gguf", spec, seed=seed,
                           name=f"tiny-mtp{heads}")


# ---------------------------------------------------------------------------
# Hybrid targets: Qwen3.5 and Qwen3-Next (gated delta net layers and attention layers)
# ---------------------------------------------------------------------------

QWEN35 = "qwen35"
QWEN3NEXT = "qwen3next"  # Qwen3.5's layers with a mixture of experts; this llama.cpp cannot roll it back


# A chat template for the hybrid models (SmolLM2's tokens) that treats earlier turns as Qwen3.5's
# does: an answer's reasoning is dropped once it is not the last turn, so the next prompt renders
# it otherwise than the cache holds it, from the generation prompt's "<think>\n" on.
REASONING_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message.role == 'assistant' -%}"
    "<|im_start|>assistant\n{{ message.content.split('</think>')[-1].lstrip('\n') }}<|im_end|>\n"
    "{%- else -%}"
    "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant\n<think>\n{%- endif -%}"
)


@dataclasses.dataclass(frozen=True)
class HybridSpec:
    """A Qwen3.5 (or Qwen3-Next) trunk of `n_layer` blocks, every `full_attention_interval`-th
    one attention and the rest recurrent (gated delta net), and `n_nextn` NextN blocks after
    it. Qwen3-Next's feed-forward is `n_expert` experts (one used) beside a shared one."""

    arch: str = QWEN35
    n_nextn: int = 1
    n_expert: int = 2
    n_layer: int = 4
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 128
    full_attention_interval: int = 4
    ssm_heads: int = 2  # key heads of a recurrent layer (and its value heads, without ssm_v_heads)
    ssm_head_dim: int = 16
    ssm_v_heads: int | None = None  # value heads (Qwen3.5's linear_num_value_heads: a multiple of the key heads)
    tied: bool = False  # no output.weight: the output head is token_embd's (Qwen3.5's small models)
    shared_head_norm: bool = False  # the NextN block's own output norm (the converter's mtp.norm)
    conv_kernel: int = 4
    trunk_scale: float = 0.3
    hidden_weight: float = 0.5
    logit_scale: float = 2.0
    context_length: int = 2048
    dtype: str = "f32"  # "f16": the matrices the converter's --outtype f16 writes in F16 (_converter_type)

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def value_heads(self) -> int:
        return self.ssm_v_heads or self.ssm_heads

    def recurrent(self, layer: int) -> bool:
        return layer < self.n_layer and (layer + 1) % self.full_attention_interval != 0

    def tensors(self, n_vocab: int) -> list[tuple[str, tuple[int, ...]]]:
        d, kv = self.n_embd, self.n_head_kv * self.head_dim
        keys, inner, heads = self.ssm_heads * self.ssm_head_dim, self.value_heads * self.ssm_head_dim, self.value_heads
        names = [("token_embd.weight", (n_vocab, d))]
        for i in range(self.n_layer + self.n_nextn):
            names += [(f"blk.{i}.attn_norm.weight", (d,)), (f"blk.{i}.post_attention_norm.weight", (d,))]
            if self.recurrent(i):
                gates = ([(f"blk.{i}.ssm_ba.weight", (2 * heads, d))] if self.arch == QWEN3NEXT else
                         [(f"blk.{i}.ssm_beta.weight", (heads, d)),
                          (f"blk.{i}.ssm_alpha.weight", (heads, d))])
                names += [
                    (f"blk.{i}.attn_qkv.weight", (2 * keys + inner, d)), (f"blk.{i}.attn_gate.weight", (inner, d)),
                    (f"blk.{i}.ssm_conv1d.weight", (2 * keys + inner, self.conv_kernel)),
                    (f"blk.{i}.ssm_dt.bias", (heads,)), (f"blk.{i}.ssm_a", (heads,)), *gates,
                    (f"blk.{i}.ssm_norm.weight", (self.ssm_head_dim,)), (f"blk.{i}.ssm_out.weight", (d, inner)),
                ]
            else:  # attention: the query projection writes a gate beside each head's query
                names += [
                    (f"blk.{i}.attn_q.weight", (2 * d, d)), (f"blk.{i}.attn_k.weight", (kv, d)),
                    (f"blk.{i}.attn_v.weight", (kv, d)), (f"blk.{i}.attn_output.weight", (d, d)),
                    (f"blk.{i}.attn_q_norm.weight", (self.head_dim,)),
                    (f"blk.{i}.attn_k_norm.weight", (self.head_dim,)),
                ]
            names += self._feed_forward(i)
            if i >= self.n_layer:
                names += [(f"blk.{i}.nextn.eh_proj.weight", (d, 2 * d)), (f"blk.{i}.nextn.enorm.weight", (d,)),
                          (f"blk.{i}.nextn.hnorm.weight", (d,))]
                names += [(f"blk.{i}.nextn.shared_head_norm.weight", (d,))] if self.shared_head_norm else []
        return names + [("output_norm.weight", (d,))] + ([] if self.tied else [("output.weight", (n_vocab, d))])

    def _feed_forward(self, i: int) -> list[tuple[str, tuple[int, ...]]]:
        d, ff, experts = self.n_embd, self.n_ff, self.n_expert
        if self.arch != QWEN3NEXT:
            return [(f"blk.{i}.ffn_gate.weight", (ff, d)), (f"blk.{i}.ffn_up.weight", (ff, d)),
                    (f"blk.{i}.ffn_down.weight", (d, ff))]
        return [(f"blk.{i}.ffn_gate_inp.weight", (experts, d)), (f"blk.{i}.ffn_gate_exps.weight", (experts, ff, d)),
                (f"blk.{i}.ffn_up_exps.weight", (experts, ff, d)), (f"blk.{i}.ffn_down_exps.weight", (experts, d, ff)),
                (f"blk.{i}.ffn_gate_inp_shexp.weight", (d,)), (f"blk.{i}.ffn_gate_shexp.weight", (ff, d)),
                (f"blk.{i}.ffn_up_shexp.weight", (ff, d)), (f"blk.{i}.ffn_down_shexp.weight", (d, ff))]


# Qwen3.5 as llama.cpp's converter writes it (conversion/qwen.py): more value heads than key heads
# in its linear attention (linear_num_value_heads, as Qwen3.5-27B's 48 against 16), a tied
# output, and the MTP block's own output norm (mtp.norm -> nextn.shared_head_norm); rows of 256
# and more, so Q4_K quantizes every matrix (no fallback type). Tied, the trunk mostly writes the
# token it read again; its blocks add enough (trunk_scale) that it sometimes does not, and the
# NextN block, predicting the same, is sometimes wrong.
QWEN35_CONVERTED = HybridSpec(n_embd=256, n_ff=512, n_head=4, n_head_kv=1, ssm_heads=2, ssm_v_heads=4,
                              ssm_head_dim=64, tied=True, shared_head_norm=True, trunk_scale=1.2)
# Llama 3 8B's width and depth (with Llama 3's vocabulary: 8.1B parameters) in that layout, F16
# as the converter writes it: three gated-delta-net layers to one attention layer, 16 key and 32
# value heads of 128, attention heads of 256 (Qwen3.5's), an output head of its own (the
# successor map, as MIMO_8B's) and one NextN block: a memory-bound hybrid target for a GPU. Its
# trunk_scale: at its depth and n_embd 512 on the CPU, MTP -k 3 kept 0.84-1.0 of first drafts
# (0.76-0.85 of third) on three prompts; 0.25 kept every draft, 0.6 under half.
QWEN35_8B = HybridSpec(n_layer=32, n_embd=4096, n_head=16, n_head_kv=4, n_ff=12288, ssm_heads=16, ssm_v_heads=32,
                       ssm_head_dim=128, shared_head_norm=True, trunk_scale=0.45, context_length=4096, dtype="f16")
HYBRID_SHAPES = {"qwen35": QWEN35_CONVERTED, "qwen35-8b": QWEN35_8B}


def _hybrid_values(name: str, shape: tuple[int, ...], spec: HybridSpec, seed: int) -> np.ndarray:
    """Unit norms, a decay of about 0.5 a token in the recurrent layers, the NextN input
    projection [I, hidden_weight * I], and random projections whose outputs add terms of
    RMS about `trunk_scale` to the residual stream."""
    if name.endswith("ssm_a"):
        return np.full(shape, -1.0, dtype=np.float32)  # -exp(A_log)
    if name.endswith("ssm_dt.bias"):
        return np.zeros(shape, dtype=np.float32)
    return _trunk_values(name, shape, spec, seed, spec.trunk_scale)


# The projections that write into the residual stream: their outputs are scaled (_trunk_values).
_OUTPUT_PROJECTIONS = ("attn_output.weight", "ffn_down.weight", "ssm_out.weight", "ffn_down_exps.weight",
                       "ffn_down_shexp.weight")


def _trunk_values(name: str, shape: tuple[int, ...], spec, seed: int, scale: float) -> np.ndarray:
    """A hybrid or GLM block's tensor: unit vectors, the NextN input projection [I, hidden_weight
    * I], and random projections, those writing into the residual stream adding terms of RMS
    about `scale`."""
    if len(shape) == 1:
        return np.ones(shape, dtype=np.float32)
    if name.endswith("nextn.eh_proj.weight"):
        eye = np.eye(spec.n_embd, dtype=np.float32)
        return np.hstack([eye, spec.hidden_weight * eye])
    std = 1.0 / np.sqrt(shape[-1])
    if name.endswith(_OUTPUT_PROJECTIONS):
        std *= scale * 2.0
    return _random(name, shape, seed, std)


def write_tiny_hybrid(out_dir: str | os.PathLike[str], spec: HybridSpec = HybridSpec(), *, seed: int = 0,
                      vocab: Vocabulary | str | os.PathLike[str] | None = None, name: str | None = None,
                      trunk_only: bool = False, sidecar: bool = False, workers: int = 1) -> Path:
    """A tiny Qwen3.5 (three gated-delta-net layers, one attention layer, one NextN block;
    n_embd 64, SmolLM2's vocabulary), weighted like `write_tiny_mtp`'s models: for the
    question whether a hybrid target's recurrent state can be rewound after a rejected draft.
    `spec.arch` QWEN3NEXT: a tiny Qwen3-Next instead, whose state this llama.cpp keeps no
    snapshots of. `name`: the file's name; `trunk_only` leaves the NextN block's tensors out and
    `sidecar` writes them alone, with the embeddings and the output head (the converter's
    `--no-mtp` and `--mtp` files: the same seed, the same weights). `spec.dtype` "f16" and
    `workers` write a large one (QWEN35_8B) as write_mtp_model writes MIMO_8B."""
    if not isinstance(vocab, Vocabulary):
        vocab = load_vocabulary(vocab)
    path = Path(out_dir) / (name or f"tiny-{spec.arch}{'-mtp' if spec.n_nextn else ''}-s{seed}.gguf")
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    arch = spec.arch
    writer = gguf.GGUFWriter(partial, arch)
    u32 = GGUFValueType.UINT32
    keys: dict[str, tuple[object, GGUFValueType]] = {
        "context_length": (spec.context_length, u32), "embedding_length": (spec.n_embd, u32),
        # (the converter's --no-mtp trunk declares no NextN layers: its blocks are the trunk's)
        "block_count": (spec.n_layer + (0 if trunk_only else spec.n_nextn), u32),
        **({} if trunk_only else {"nextn_predict_layers": (spec.n_nextn, u32)}),
        "feed_forward_length": (spec.n_ff, u32), "attention.head_count": (spec.n_head, u32),
        "attention.head_count_kv": (spec.n_head_kv, u32),
        "attention.layer_norm_rms_epsilon": (1e-6, GGUFValueType.FLOAT32),
        "rope.dimension_count": (spec.head_dim // 2, u32), "rope.freq_base": (10000.0, GGUFValueType.FLOAT32),
        "full_attention_interval": (spec.full_attention_interval, u32), "ssm.conv_kernel": (spec.conv_kernel, u32),
        "ssm.state_size": (spec.ssm_head_dim, u32), "ssm.group_count": (spec.ssm_heads, u32),
        "ssm.time_step_rank": (spec.value_heads, u32), "ssm.inner_size": (spec.value_heads * spec.ssm_head_dim, u32),
        "vocab_size": (vocab.n_tokens, u32),
    }
    if arch == QWEN3NEXT:
        keys.update({"expert_count": (spec.n_expert, u32), "expert_used_count": (1, u32),
                     "expert_feed_forward_length": (spec.n_ff, u32),
                     "expert_shared_feed_forward_length": (spec.n_ff, u32)})
    writer.add_name(path.stem.rsplit("-s", 1)[0])  # "tiny-qwen35-mtp"
    for key, (value, kind) in keys.items():
        writer.add_key_value(f"{arch}.{key}", value, kind)
    if arch == QWEN35:
        sections = [spec.head_dim // 8, spec.head_dim // 16, spec.head_dim // 16, 0]  # n_rot / 2 in all
        writer.add_key_value(f"{arch}.rope.dimension_sections", sections, GGUFValueType.ARRAY, GGUFValueType.INT32)
    tensors = spec.tensors(vocab.n_tokens)
    block = lambda tensor_name: int(tensor_name.split(".")[1]) if tensor_name.startswith("blk.") else None  # noqa: E731
    if trunk_only:
        tensors = [(n, shape) for n, shape in tensors if (block(n) or 0) < spec.n_layer]
    if sidecar:
        tensors = [(n, shape) for n, shape in tensors if block(n) is None or block(n) >= spec.n_layer]
    return _write_tensors(writer, partial, path, vocab, tensors, spec, seed, _hybrid_values,
                          f16=spec.dtype == "f16", workers=workers)


def _converter_type(name: str, shape: tuple[int, ...]) -> np.dtype:
    """A tensor's type in the converter's F16 output (conversion/base.py): vectors, norms,
    convolutions, routers and tensors not named `.weight` in F32, every other matrix in F16."""
    kept = len(shape) <= 1 or name.endswith(("_norm.weight", "ssm_conv1d.weight", "ffn_gate_inp.weight",
                                             "ffn_gate_inp_shexp.weight")) or not name.endswith(".weight")
    return np.dtype(np.float32 if kept else np.float16)


def _write_tensors(writer: gguf.GGUFWriter, partial: Path, path: Path, vocab: Vocabulary,
                   tensors: list[tuple[str, tuple[int, ...]]], spec, seed: int, values: Callable, *,
                   f16: bool = False, workers: int = 1) -> Path:
    """The rest of a hybrid or GLM file: the vocabulary's keys, the embeddings, the successor
    output head, `values(name, shape, spec, seed)` for the others, every tensor in F32 (`f16`:
    as the converter types them); `workers` threads make the next tensors while earlier ones
    are written (the same file); the finished file moved to `path`."""
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if f16 else gguf.LlamaFileType.ALL_F32)
    for key, field in vocab.fields.items():
        writer.add_key_value(key, field.value, field.type, field.sub_type)
    types = {name: _converter_type(name, shape) if f16 else np.dtype(np.float32) for name, shape in tensors}
    for tensor_name, shape in tensors:
        writer.add_tensor_info(tensor_name, shape, types[tensor_name], int(np.prod(shape)) * types[tensor_name].itemsize)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    embeddings = _random("token_embd.weight", (vocab.n_tokens, spec.n_embd), seed, 1.0)

    def made(tensor: tuple[str, tuple[int, ...]]) -> np.ndarray:
        tensor_name, shape = tensor
        if tensor_name == "token_embd.weight":
            value = embeddings
        elif tensor_name == "output.weight":
            value = _output_head(embeddings, vocab, spec.logit_scale, seed)
        else:
            value = values(tensor_name, shape, spec, seed)
        return value.astype(types[tensor_name], copy=False)

    return _write_in_order(writer, tensors, made, workers, partial, path)


@functools.lru_cache(maxsize=2)
def _tensors(path: str | os.PathLike[str]) -> tuple[gguf.GGUFReader, dict[str, np.ndarray]]:
    reader = gguf.GGUFReader(path)
    return reader, {tensor.name: np.asarray(tensor.data, dtype=np.float32) for tensor in reader.tensors}


def _rms_norm(x: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6)


def output_logits(path: str | os.PathLike[str], hidden: np.ndarray) -> np.ndarray:
    """The logits the model's output head writes for hidden states `hidden` (rows): what the
    trunk writes after the hidden state it puts out for the NextN layers."""
    _, tensors = _tensors(path)
    return _rms_norm(hidden) @ tensors["output.weight"].T


def head_logits(path: str | os.PathLike[str], token: int, hidden: np.ndarray, layer: int | None = None) -> np.ndarray:
    """The logits a NextN block whose attention and feed-forward add nothing (head_scale 0)
    writes after reading `token` with the trunk's hidden state `hidden`: the output head over
    RMS-normalised eh_proj @ [rms(embedding); rms(hidden)]. `layer`: the block's index in the
    file (default: the first NextN block)."""
    reader, tensors = _tensors(path)
    n_layer = int(reader.fields[f"{ARCH}.block_count"].parts[-1][0]) - int(
        reader.fields[f"{ARCH}.nextn_predict_layers"].parts[-1][0])
    layer = n_layer if layer is None else layer
    embedding = tensors["token_embd.weight"][token]
    mixed = tensors[f"blk.{layer}.nextn.eh_proj.weight"] @ np.concatenate([_rms_norm(embedding), _rms_norm(hidden)])
    return tensors["output.weight"] @ _rms_norm(mixed)


# ---------------------------------------------------------------------------
# GLM-4.5 (glm4moe): a mixture of experts with a NextN block, as llama.cpp's converter writes it
# ---------------------------------------------------------------------------

GLM4MOE = "glm4moe"


@dataclasses.dataclass(frozen=True)
class Glm4MoeSpec:
    """A GLM-4.5 trunk: `n_dense` dense blocks first (leading_dense_block_count), then blocks of
    `n_expert` experts (`n_used` routed a token, sigmoid gating) beside one shared expert; q, k
    and v with biases; one NextN block after it, with its own output norm (shared_head_norm)."""

    n_layer: int = 3
    n_dense: int = 1
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 128
    n_expert: int = 4
    n_used: int = 2
    n_ff_expert: int = 64
    trunk_scale: float = 0.45  # (its routed and shared experts add more than a dense block: drafts kept and rejected)
    head_scale: float = 0.1
    hidden_weight: float = 0.5
    logit_scale: float = 2.0
    context_length: int = 2048

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def tensors(self, n_vocab: int) -> list[tuple[str, tuple[int, ...]]]:
        d, hd, kv, ff, fe, e = self.n_embd, self.head_dim, self.n_head_kv * self.head_dim, self.n_ff, self.n_ff_expert, self.n_expert
        names = [("token_embd.weight", (n_vocab, d))]
        for i in range(self.n_layer + 1):
            names += [(f"blk.{i}.attn_norm.weight", (d,)),
                      (f"blk.{i}.attn_q.weight", (self.n_head * hd, d)), (f"blk.{i}.attn_q.bias", (self.n_head * hd,)),
                      (f"blk.{i}.attn_k.weight", (kv, d)), (f"blk.{i}.attn_k.bias", (kv,)),
                      (f"blk.{i}.attn_v.weight", (kv, d)), (f"blk.{i}.attn_v.bias", (kv,)),
                      (f"blk.{i}.attn_output.weight", (d, self.n_head * hd)),
                      (f"blk.{i}.post_attention_norm.weight", (d,))]
            if i < self.n_dense:
                names += [(f"blk.{i}.ffn_gate.weight", (ff, d)), (f"blk.{i}.ffn_up.weight", (ff, d)),
                          (f"blk.{i}.ffn_down.weight", (d, ff))]
            else:
                names += [(f"blk.{i}.ffn_gate_inp.weight", (e, d)), (f"blk.{i}.exp_probs_b.bias", (e,)),
                          (f"blk.{i}.ffn_gate_exps.weight", (e, fe, d)), (f"blk.{i}.ffn_up_exps.weight", (e, fe, d)),
                          (f"blk.{i}.ffn_down_exps.weight", (e, d, fe)),
                          (f"blk.{i}.ffn_gate_shexp.weight", (fe, d)), (f"blk.{i}.ffn_up_shexp.weight", (fe, d)),
                          (f"blk.{i}.ffn_down_shexp.weight", (d, fe))]
            if i >= self.n_layer:
                names += [(f"blk.{i}.nextn.eh_proj.weight", (d, 2 * d)), (f"blk.{i}.nextn.enorm.weight", (d,)),
                          (f"blk.{i}.nextn.hnorm.weight", (d,)), (f"blk.{i}.nextn.shared_head_norm.weight", (d,))]
        return names + [("output_norm.weight", (d,)), ("output.weight", (n_vocab, d))]


def _glm_values(name: str, shape: tuple[int, ...], spec: Glm4MoeSpec, seed: int) -> np.ndarray:
    """Unit norms, zero biases, the NextN input projection [I, hidden_weight * I], and random
    projections whose outputs add terms of the block's scale to the residual stream."""
    if name.endswith(".bias"):
        return np.zeros(shape, dtype=np.float32)
    block = int(name.split(".")[1]) if name.startswith("blk.") else 0
    return _trunk_values(name, shape, spec, seed, spec.trunk_scale if block < spec.n_layer else spec.head_scale)


def write_tiny_glm4moe(out_dir: str | os.PathLike[str], spec: Glm4MoeSpec = Glm4MoeSpec(), *, seed: int = 0,
                       vocab: Vocabulary | str | os.PathLike[str] | None = None) -> Path:
    """A tiny GLM-4.5 with its NextN block (SmolLM2's vocabulary), weighted like the MiMo's: the
    trunk writes each token's successor and the NextN block predicts it."""
    if not isinstance(vocab, Vocabulary):
        vocab = load_vocabulary(vocab)
    path = Path(out_dir) / f"tiny-{GLM4MOE}-mtp-s{seed}.gguf"
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    writer = gguf.GGUFWriter(partial, GLM4MOE)
    u32, f32 = GGUFValueType.UINT32, GGUFValueType.FLOAT32
    keys: dict[str, tuple[object, GGUFValueType]] = {
        "context_length": (spec.context_length, u32), "embedding_length": (spec.n_embd, u32),
        "block_count": (spec.n_layer + 1, u32), "nextn_predict_layers": (1, u32),
        "feed_forward_length": (spec.n_ff, u32), "attention.head_count": (spec.n_head, u32),
        "attention.head_count_kv": (spec.n_head_kv, u32), "attention.layer_norm_rms_epsilon": (1e-5, f32),
        "rope.dimension_count": (spec.head_dim // 2, u32), "rope.freq_base": (10000.0, f32),
        "expert_count": (spec.n_expert, u32), "expert_used_count": (spec.n_used, u32),
        "expert_feed_forward_length": (spec.n_ff_expert, u32), "expert_shared_count": (1, u32),
        "leading_dense_block_count": (spec.n_dense, u32), "expert_weights_scale": (1.0, f32),
        "expert_weights_norm": (True, GGUFValueType.BOOL), "expert_gating_func": (2, u32),  # sigmoid
        "vocab_size": (vocab.n_tokens, u32),
    }
    writer.add_name(path.stem.rsplit("-s", 1)[0])
    for key, (value, kind) in keys.items():
        writer.add_key_value(f"{GLM4MOE}.{key}", value, kind)
    return _write_tensors(writer, partial, path, vocab, spec.tensors(vocab.n_tokens), spec, seed, _glm_values)
