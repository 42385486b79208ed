"""The one owner of llama.cpp's multi-token-prediction (MTP, "NextN") binding.

Some GGUFs carry NextN layers after their trunk (MiMo-2, GLM-4.x, DeepSeek, Qwen3.5): each
is a decoder block that reads a token's embedding beside the trunk's hidden state at the
position before it, and predicts the token after it. llama.cpp runs them in an MTP context
over the target's own weights (`LLAMA_CONTEXT_TYPE_MTP`, `ctx_other`), fed through the
extended batch API with one hidden-state row per token; the target outputs those rows for
every token it decodes once its NextN embeddings are on (`llama_set_embeddings_nextn`,
unmasked). The API is new and marked unstable, so only this module touches it.

Invariants:
- MTP entry q holds (token q, the target's hidden state at q - 1); entry 0 a zero state, as
  in llama.cpp's `draft-mtp`. An entry's inputs depend only on tokens 0..q, so a cache that
  matches the committed tokens up to q is valid up to q.
- `MtpHeads` keeps the target's hidden rows by sequence (its contexts take as many sequences as
  the target: its slots), by position from `low` up: the row of every such
  position below the sequence's n_past is the one its current content wrote (each decode
  overwrites the rows of its positions; a rewind only lowers n_past). The caches release the
  rows they have read (`release`), so the rows kept are those a catch-up still needs, not one
  per position of the context; a rewind below `low` reads zeros there (a draft's input only:
  what it drafts is verified).
- A model with one NextN layer drafts at any depth, the layer reading its own last state;
  with several, step i is drafted by layer i (llama.cpp's chained heads), so the depth is
  their number. Each chained layer has its own context, so each cache is written by one layer.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import llama_cpp as llama
import numpy as np

from specli.errors import MtpUnavailableError
from specli.llama.backend import DecodeError, LoadSettings, Model, check_gguf_file
from specli.llama.gguf_header import read_header

try:  # llama.cpp's staging API (llama-ext.h): its module fails to import where a symbol is missing
    from llama_cpp import llama_cpp_ext as _ext
except (ImportError, AttributeError, OSError) as _error:
    _ext = None
    _EXT_MISSING = str(_error)

_BINDING_NAMES = ("LLAMA_CONTEXT_TYPE_MTP", "llama_model_n_layer_nextn", "llama_embd", "llama_process",
                  "llama_batch_ext_init", "llama_batch_ext_free", "llama_batch_ext_clear", "llama_batch_ext_add_token",
                  "llama_batch_ext_set_pos", "llama_batch_ext_set_embd_token", "llama_batch_ext_set_output_logits")
_EXT_NAMES = ("llama_set_embeddings_nextn", "llama_get_embeddings_nextn", "llama_get_embeddings_nextn_ith",
              "llama_set_nextn_layer_offset")
_HINT = "install a llama-cpp-python with llama.cpp's MTP API (0.3.36 or later), or draft with another --draft"


def unsupported_reason() -> str | None:
    """Why this build of llama-cpp-python cannot draft with NextN layers; None where it can."""
    missing = [name for name in _BINDING_NAMES if not hasattr(llama, name)]
    fields = {name for name, _ in getattr(llama.llama_model_params, "_fields_", ())}
    fields |= {name for name, _ in getattr(llama.llama_context_params, "_fields_", ())}
    missing += [name for name in ("load_mtp", "ctx_type", "ctx_other") if name not in fields]
    if _ext is None:
        return f"llama-cpp-python {getattr(llama, '__version__', '?')} has no MTP staging API ({_EXT_MISSING})"
    missing += [name for name in _EXT_NAMES if not hasattr(_ext, name)]
    if missing:
        return f"llama-cpp-python {getattr(llama, '__version__', '?')} lacks {', '.join(missing)}"
    return None


# What the llama.cpp that llama-cpp-python 0.3.36 vendors builds for a file's NextN layers, by
# architecture (its src/models/*.cpp), read before anything is opened: llama.cpp itself has no
# guard, and opening an MTP context where it has no graph, or more layers than its graph takes,
# fails or aborts the process (llama.cpp's own draft-mtp included).
CHAINED = frozenset({"mimo2", "step35", "hy_v3"})  # a graph over any number of layers, chained
ONE_LAYER = frozenset({"qwen35", "qwen35moe", "qwen3next", "glm4moe", "glm-dsa", "deepseek2", "deepseek32",
                       "deepseek4", "cohere2moe", "bailingmoe3", "nemotron_h_moe"})  # asserts exactly one
NO_GRAPH = {  # NextN tensors in the file, no MTP graph in this llama.cpp
    **dict.fromkeys(("glm4", "exaone4", "exaone-moe", "bailingmoe2", "dots3note"), "skips their tensors at load"),
    "nemotron_h": "loads them but builds only the trunk's graph",
    "glm5-next": "has no graph for them yet",
}


def graph_problem(arch: str, layers: int) -> str | None:
    """Why this llama.cpp cannot draft with `layers` NextN layers of architecture `arch` (None:
    it can), from the table above; an architecture it does not list is refused."""
    if arch in CHAINED or (arch in ONE_LAYER and layers == 1):
        return None
    if arch in ONE_LAYER:
        return f"llama.cpp's {arch} MTP graph takes one NextN layer and aborts on this file's {layers}"
    if arch in NO_GRAPH:
        return f"llama.cpp {NO_GRAPH[arch]} for {arch}: it has no MTP graph to draft with"
    return f"llama.cpp has no MTP graph for {arch}"


def supports_mtp() -> bool:
    """Whether this build can draft with a target's NextN layers (for `doctor`)."""
    return unsupported_reason() is None


def _declared_and_held(path: Path | str) -> tuple[int, bool, str]:
    """The NextN layers the GGUF's header declares, whether the file holds the first one's
    tensors (a trunk-only file leaves them to an MTP sidecar GGUF), and its architecture."""
    header = read_header(path)
    arch = header.metadata.get("general.architecture", "")
    declared, blocks = (header.metadata.get(f"{arch}.{key}", 0) for key in ("nextn_predict_layers", "block_count"))
    if not isinstance(declared, int) or not isinstance(blocks, int) or declared <= 0:
        return 0, False, arch
    probe = f"blk.{blocks - declared}.nextn.eh_proj.weight"
    return declared, any(tensor.name == probe for tensor in header.tensors), arch


def sidecar_for(path: Path | str, named: Path | str | None = None) -> Path | None:
    """The MTP file that holds a trunk's NextN layers (None: there is none, or the file holds
    its own): `named` (--draft FILE), else an `mtp-*.gguf` in the same folder, as llama.cpp's
    converter writes it (`--mtp`, beside the `--no-mtp` trunk) and its `-hf` downloads it."""
    path = Path(path)
    if _declared_and_held(path)[1]:
        return None
    if named is not None:
        return Path(named) if sidecar_problem(path, named) is None else None
    for candidate in sorted(path.parent.glob("mtp-*.gguf")):
        if candidate != path and sidecar_problem(path, candidate) is None:
            return candidate
    return None


def is_sidecar(path: Path | str) -> bool:
    """Whether the GGUF at `path` holds NextN layers and no trunk block (an MTP file)."""
    try:
        header = read_header(path)
    except Exception:  # noqa: BLE001 - a file that is not a readable GGUF is no sidecar
        return False
    found, has, _ = _declared_and_held(path)
    return bool(found and has and "blk.0.attn_norm.weight" not in {tensor.name for tensor in header.tensors})


def _trunk_blocks(path: Path | str, arch: str) -> tuple[object, object]:
    """A file's trunk blocks (its blocks but the NextN layers it declares) and its width."""
    metadata = read_header(path).metadata
    blocks, declared = metadata.get(f"{arch}.block_count", 0), metadata.get(f"{arch}.nextn_predict_layers", 0)
    trunk = blocks - declared if isinstance(blocks, int) and isinstance(declared, int) else None
    return trunk, metadata.get(f"{arch}.embedding_length")


def sidecar_problem(target: Path | str, sidecar: Path | str) -> str | None:
    """Why `sidecar` is not the MTP file of the trunk `target` (None: it is): one of its
    architecture, trunk depth and width, with the NextN layers the trunk declares where it
    declares any (the converter's `--no-mtp` trunk declares none; an older split, its own)."""
    declared, held, arch = _declared_and_held(target)
    name = Path(sidecar).name
    if not is_sidecar(sidecar):
        return f"{name} is not an MTP file (NextN layers without a trunk)"
    if held:
        return f"{Path(target).name} holds its NextN layers itself"
    found, _, kind = _declared_and_held(sidecar)
    ours, theirs = _trunk_blocks(target, arch), _trunk_blocks(sidecar, kind)
    if kind != arch or ours != theirs or (declared and found != declared):
        return (f"{name} ({kind}, {theirs[0]} trunk blocks, width {theirs[1]}) is not the MTP file of "
                f"{Path(target).name} ({arch}, {ours[0]} blocks, width {ours[1]})")
    return None


def _nextn_source(path: Path | str, named: Path | str | None = None) -> tuple[int, str, Path | None]:
    """(the NextN layers the GGUF at `path` holds, or its MTP file does; its architecture; that
    MTP file, None where the GGUF holds them or there are none), from headers alone."""
    declared, held, arch = _declared_and_held(path)
    if held:
        return declared, arch, None
    sidecar = sidecar_for(path, named)
    return (_declared_and_held(sidecar)[0] if sidecar is not None else 0), arch, sidecar


def nextn_layers(path: Path | str) -> int:
    """How many NextN layers the GGUF at `path` holds, or its MTP sidecar does (sidecar_for),
    where this llama.cpp can draft with them (0: none, only declared, or no MTP graph for
    them: nextn_problem says), read from headers without llama.cpp."""
    layers, arch, _ = _nextn_source(path)
    return layers if layers and graph_problem(arch, layers) is None else 0


def nextn_problem(path: Path | str) -> str | None:
    """Why the NextN layers the GGUF at `path` (or its sidecar) holds cannot draft on this
    llama.cpp (None: it holds none, or they can)."""
    layers, arch, _ = _nextn_source(path)
    return graph_problem(arch, layers) if layers else None


def nextn_share(path: Path | str) -> float:
    """What drafting a token with the first NextN layer reads, as a share of a plain decode's
    weights: that block and the output head, over the trunk's blocks and the output head (the
    pricing's guess before its decode is timed). 0.0 where the file holds no NextN layers."""
    header = read_header(path)
    arch = header.metadata.get("general.architecture", "")
    declared, blocks = (header.metadata.get(f"{arch}.{key}", 0) for key in ("nextn_predict_layers", "block_count"))
    if not isinstance(declared, int) or not isinstance(blocks, int) or declared <= 0:
        return 0.0
    sizes = {tensor.name: tensor.size or 0 for tensor in header.tensors}
    head = sizes.get("output.weight") or sizes.get("token_embd.weight", 0)

    def block(index: int) -> int:
        return sum(size for name, size in sizes.items() if name.startswith(f"blk.{index}."))

    trunk = sum(block(index) for index in range(blocks - declared))
    return (block(blocks - declared) + head) / max(1, trunk + head)


def load_model(path: Path | str, settings: LoadSettings = LoadSettings(), **model_options) -> Model:
    """A target as specli loads every target: with its NextN layers and their hidden states
    (`load_target`) where the file holds them and this build can run them, else plainly. The
    hidden states change the trunk's own computation (its last layer runs on every row), so
    plain decoding of such a model computes as MTP drafting does."""
    check_gguf_file(Path(path))  # a missing or broken file: the loader's own one line
    if supports_mtp() and nextn_layers(path) > 0:
        return load_target(path, settings, **model_options)
    return Model(path, settings, **model_options)


def load_target(path: Path | str, settings: LoadSettings = LoadSettings(), *, sidecar: Path | None = None,
                **model_options) -> Model:
    """The target at `path` loaded with its NextN layers and its hidden states put out for
    every decoded token, ready for `MtpHeads`. Plain decoding compared with MTP drafting
    loads the target this way too: the hidden states keep the trunk's last layer running on
    every row, which may round its logits differently. `sidecar`: the MTP file named for a
    trunk-only target (else one beside it). MtpUnavailableError where this build or the file
    cannot draft this way."""
    reason = unsupported_reason()
    if reason is not None:
        raise MtpUnavailableError(f"--draft mtp needs llama.cpp's MTP API: {reason}", _HINT)
    check_gguf_file(Path(path))
    declared, held, arch = _declared_and_held(path)
    if sidecar is not None and (problem := sidecar_problem(path, sidecar)) is not None:
        raise MtpUnavailableError(problem, "name the mtp-*.gguf converted with this model, or use another --draft")
    layers, arch, found = _nextn_source(path, sidecar)
    if not layers:
        if declared:
            raise MtpUnavailableError(f"{Path(path).name} declares {declared} NextN (MTP) layers but holds none of "
                                      "their tensors, and no mtp-*.gguf beside it holds them",
                                      "put the model's MTP file (mtp-*.gguf) beside it, or name it: --draft FILE")
        raise MtpUnavailableError(f"{Path(path).name} has no NextN (MTP) layers to draft with",
                                  "use a GGUF converted with its MTP layers, its mtp-*.gguf beside it, or another --draft")
    problem = graph_problem(arch, layers)
    if problem is not None:
        raise MtpUnavailableError(f"{Path(path).name}: {problem}", "draft with --draft ngram or a draft model")
    # (a trunk whose layers are in an MTP file loads as it is: MtpHeads loads that file)
    target = Model(path, settings, load_mtp=found is None or declared > 0, **model_options)
    if found is None and llama.llama_model_n_layer_nextn(target.model_handle) <= 0:
        target.close()
        raise MtpUnavailableError(f"llama.cpp loaded no NextN layers from {Path(path).name}",
                                  "use a GGUF converted with its MTP layers, or another --draft")
    _ext.llama_set_embeddings_nextn(target.context_handle, True, False)
    return target


def _load_sidecar(path: Path, target: Model):
    """The MTP file's model (no context of its own: MtpHeads opens MTP contexts on it), its
    layers where the target's are (on the GPU or not)."""
    params = llama.llama_model_default_params()
    params.n_gpu_layers = -1 if target.on_gpu else 0
    params.load_mtp = True
    model = llama.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        raise MtpUnavailableError(f"llama.cpp could not load the MTP file {path.name}",
                                  "rerun with --verbose for llama.cpp's reason")
    return model


# The most hidden rows kept behind the target's end once every cache has read them: a catch-up
# needs only what was committed since a cache last drafted.
KEEP_BEHIND = 1024


class MtpHeads:
    """The MTP context(s) over a target from `load_target`: one for a single NextN layer,
    one per layer for chained layers. Each appends entries (token, hidden-state row) and
    gives the logits and the hidden state it writes after the last; `rewind` forgets
    positions. The target's hidden states are kept by position as it decodes them, and let
    go once every cache has read them (`release`): what a catch-up needs, not a row of
    n_embd floats (16 KB at n_embd 4096) for every position of the context."""

    def __init__(self, target: Model, sidecar: Path | None = None) -> None:
        reason = unsupported_reason()
        if reason is not None:
            raise MtpUnavailableError(f"--draft mtp needs llama.cpp's MTP API: {reason}", _HINT)
        self.target = target
        # A trunk-only target's NextN layers come from its sidecar: a model of its own, loaded
        # MTP-only, whose contexts read the target's (as llama.cpp's draft-mtp loads it).
        self._sidecar = None
        sidecar = sidecar_for(target.path, sidecar)
        if sidecar is not None:
            self._sidecar = _load_sidecar(sidecar, target)
        self._heads_model = self._sidecar or target.model_handle
        self.layers = int(llama.llama_model_n_layer_nextn(self._heads_model))
        if self.layers <= 0:
            raise MtpUnavailableError(f"{target.path.name} was loaded without NextN layers",
                                      "load it with specli.llama.mtp.load_target")
        self.depth: int | None = self.layers if self.layers > 1 else None  # None: any depth
        self.n_embd = int(llama.llama_model_n_embd_out(target.model_handle))
        self.n_vocab = target.n_vocab
        self.n_ctx = target.n_ctx
        self.sequences = target.sequences  # a context's sequences, as many as the target's (its slots)
        self.batch_size = target.batch_size
        self.max_rewind = None  # (a SequenceModel of the slots' shared steps: any rewind)
        self._contexts: list = []
        self._batches: list = []
        # By sequence: its rows (row i: target position low + i) and the first position kept.
        self._rows: dict[int, np.ndarray] = {}
        self._low: dict[int, int] = {}
        for layer in range(self.layers if self.depth else 1):
            self._open(layer)
        _ext.llama_set_embeddings_nextn(target.context_handle, True, False)  # as load_target left it
        target.on_decode = self._keep_hidden
        target.on_sequences = self._keep_sequences

    def _open(self, layer: int) -> None:
        params = llama.llama_context_default_params()
        params.ctx_type = llama.LLAMA_CONTEXT_TYPE_MTP
        params.ctx_other = self.target.context_handle
        params.n_ctx = self.n_ctx * self.sequences  # each sequence's n_ctx, in one unified cache
        params.n_seq_max = self.sequences
        params.kv_unified = self.sequences > 1
        params.n_batch = params.n_ubatch = self.target.batch_size
        params.n_threads = llama.llama_n_threads(self.target.context_handle)
        params.n_threads_batch = llama.llama_n_threads_batch(self.target.context_handle)
        params.no_perf = True
        context = llama.llama_init_from_model(self._heads_model, params)
        if not context:
            self.close()
            raise MtpUnavailableError(f"llama.cpp could not create an MTP context for {self.target.path.name}",
                                      "rerun with --verbose for llama.cpp's reason")
        self._contexts.append(context)
        _ext.llama_set_embeddings_nextn(context, True, True)  # the state after each output row
        _ext.llama_set_nextn_layer_offset(context, layer)
        self._batches.append(llama.llama_batch_ext_init(context))

    def _keep_hidden(self, first: int, count: int) -> None:
        """After a target decode of positions [first, first + count) of sequence 0: keep their rows."""
        pointer = _ext.llama_get_embeddings_nextn(self.target.context_handle)
        self._keep(0, first, np.ctypeslib.as_array(pointer, shape=(count, self.n_embd)))

    def _keep_sequences(self, parts: list[tuple[int, int, int]]) -> None:
        """After a target decode of several sequences' rows ((sequence, first position, count),
        in batch order: llama.cpp puts the rows out so): keep each sequence's."""
        pointer = _ext.llama_get_embeddings_nextn(self.target.context_handle)
        rows = np.ctypeslib.as_array(pointer, shape=(sum(count for _, _, count in parts), self.n_embd))
        at = 0
        for sequence, first, count in parts:
            self._keep(sequence, first, rows[at : at + count])
            at += count

    def _keep(self, sequence: int, first: int, new: np.ndarray) -> None:
        rows, low = self._rows.get(sequence), self._low.get(sequence, 0)
        if rows is None:
            rows = np.zeros((0, self.n_embd), dtype=np.float32)
        if first < low:  # the target went back below what is kept: keep from there
            rows = np.concatenate([np.zeros((low - first, self.n_embd), dtype=np.float32), rows])
            low = first
        end = first + len(new) - low
        if end > len(rows):
            grown = np.zeros((max(end, 2 * len(rows), 64), self.n_embd), dtype=np.float32)
            grown[: len(rows)] = rows
            rows = grown
        rows[first - low : end] = new
        self._rows[sequence], self._low[sequence] = rows, low

    def release(self, below: int, sequence: int = 0, end: int | None = None) -> None:
        """The rows of positions below `below` will not be read again (each cache has read
        them), nor any KEEP_BEHIND behind the sequence's end (`end`: the target's n_past, or
        a slot's), which a chained layer that seldom drafts and lags that far reads as zeros:
        free them, once they are at least half of what is held."""
        end = self.target.n_past if end is None else end
        below = min(max(below, end - KEEP_BEHIND), end)
        rows, low = self._rows.get(sequence), self._low.get(sequence, 0)
        if rows is not None and below - low >= max(64, len(rows) // 2):
            self._rows[sequence], self._low[sequence] = np.array(rows[below - low :]), below

    @property
    def low(self) -> int:
        """Sequence 0's first position whose row is kept."""
        return self._low.get(0, 0)

    @property
    def rows_kept(self) -> int:
        """Hidden rows held for sequence 0 (n_embd float32 each)."""
        return len(self._rows.get(0, ()))

    def target_hidden(self, first: int, count: int, sequence: int = 0, end: int | None = None) -> np.ndarray:
        """The target's hidden rows of `sequence` at positions [first, first + count) (position
        -1, and any released: zeros), each one the target wrote for what its cache holds there
        now; `end`: the sequence's n_past (None: the target's)."""
        end = self.target.n_past if end is None else end
        if first + count > end:
            raise RuntimeError(f"the target holds {end} positions, not {first + count}")
        out = np.zeros((count, self.n_embd), dtype=np.float32)
        rows, low = self._rows.get(sequence), self._low.get(sequence, 0)
        start = max(first, low)
        if rows is not None and start < first + count:
            out[start - first :] = rows[start - low : first + count - low]
        return out

    def decode(self, layer: int, tokens: list[int], start: int, hidden: np.ndarray,
               *, logits: bool = True) -> tuple[np.ndarray, np.ndarray] | None:
        """Append entries (tokens[i], hidden[i]) at positions start + i to `layer`'s context
        (0 for a single NextN layer); (the logits row after the last, its hidden state),
        both copies. The state is the last entry's for a one-entry decode; for a longer one
        only on architectures whose MTP graph keeps the output rows before the state
        (MiMo-2, Step-3.5: those that chain layers), as GLM-4.x's, DeepSeek's and
        Qwen3.5's put out the batch's first rows. `logits` False (a catch-up): no row is put
        out, so the output head (a read of n_vocab × n_embd weights) is not run, as
        llama.cpp's own catch-up asks for none; returns None."""
        context, batch = self._contexts[layer], self._batches[layer]
        hidden = np.ascontiguousarray(hidden, dtype=np.float32)
        done = 0
        while done < len(tokens):
            count = min(len(tokens) - done, self.target.batch_size)
            llama.llama_batch_ext_clear(batch)
            for i in range(done, done + count):
                self._add(batch, tokens[i], start + i, hidden[i], logits and i == len(tokens) - 1)
            status = llama.llama_process(context, llama.LLAMA_PROCESS_TYPE_DECODE, batch)
            if status != 0:
                raise DecodeError(status, self.target.path, "failed to decode a batch of its MTP layers")
            done += count
        if not logits:
            return None
        index = (len(tokens) - 1) % self.target.batch_size
        logits = np.ctypeslib.as_array(llama.llama_get_logits_ith(context, index), shape=(self.n_vocab,))
        state = np.ctypeslib.as_array(_ext.llama_get_embeddings_nextn_ith(context, index), shape=(self.n_embd,))
        return logits.copy(), state.copy()

    def decode_sequences(self, parts) -> list[tuple[np.ndarray, np.ndarray] | None]:
        """One NextN layer's entries for several sequences (the slots' shared draft decodes):
        each part is (sequence, first position, tokens, which want a row (the last at most),
        their hidden rows), at most batch_size entries in all. Each part's (logits, state)
        after its last entry, copies (None: it wanted none). The parts that want no row (the
        catch-ups) go first, in a decode of their own; then the rest, one entry each, in
        another: Qwen3.5's, GLM's and DeepSeek's graphs put out the batch's first rows as
        the states (see decode), which are then the outputs' own."""
        if self.depth is not None:
            raise RuntimeError("chained NextN layers draft in one sequence only")
        context, batch = self._contexts[0], self._batches[0]
        results: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(parts)
        reading = [i for i, part in enumerate(parts) if not any(part[3])]
        writing = [i for i, part in enumerate(parts) if any(part[3])]
        for group in (reading, writing):
            if not group:
                continue
            llama.llama_batch_ext_clear(batch)
            outputs = []
            for i in group:
                sequence, first, tokens, flags, hidden = parts[i]
                if group is writing and len(tokens) != 1:
                    raise ValueError("a part that wants a row from the NextN layer holds one entry")
                hidden = np.ascontiguousarray(hidden, dtype=np.float32)
                for j, token in enumerate(tokens):
                    self._add(batch, token, first + j, hidden[j], bool(flags[j]), sequence)
                outputs += [i] if group is writing else []
            status = llama.llama_process(context, llama.LLAMA_PROCESS_TYPE_DECODE, batch)
            if status != 0:
                raise DecodeError(status, self.target.path, "failed to decode a batch of its MTP layers")
            for index, i in enumerate(outputs):
                logits = np.ctypeslib.as_array(llama.llama_get_logits_ith(context, index), shape=(self.n_vocab,))
                state = np.ctypeslib.as_array(_ext.llama_get_embeddings_nextn_ith(context, index), shape=(self.n_embd,))
                results[i] = (logits.copy(), state.copy())
        return results

    def forget(self, sequence: int, n_keep: int) -> None:
        """Forget a sequence's entries from position n_keep on (one NextN layer's context)."""
        self.rewind(0, n_keep, sequence)

    def _add(self, batch, token: int, position: int, row: np.ndarray, output: bool, sequence: int = 0) -> None:
        index = llama.llama_batch_ext_add_token(batch, sequence, token)
        if index < 0:
            raise DecodeError(index, self.target.path, "could not add a token to an MTP batch")
        # The row is copied into the batch at once (llama_batch_ext keeps its own embeddings).
        embedding = llama.llama_embd(row.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1, self.n_embd)
        llama.llama_batch_ext_set_pos(batch, index, ctypes.byref(llama.llama_pos(position)))
        llama.llama_batch_ext_set_embd_token(batch, index, embedding)
        llama.llama_batch_ext_set_output_logits(batch, index, output)

    def rewind(self, layer: int, n_keep: int, sequence: int = 0) -> None:
        """Forget `layer`'s entries (of `sequence`) from position n_keep on."""
        memory = llama.llama_get_memory(self._contexts[layer])
        if not llama.llama_memory_seq_rm(memory, sequence, n_keep, -1):
            raise DecodeError(-1, self.target.path, f"could not remove MTP positions {n_keep}..")

    def close(self) -> None:
        """Free the MTP contexts (before the target they read)."""
        if self.target.on_decode == self._keep_hidden:
            self.target.on_decode = None
        if self.target.on_sequences == self._keep_sequences:
            self.target.on_sequences = None
        for batch in self._batches:
            llama.llama_batch_ext_free(batch)
        for context in self._contexts:
            llama.llama_free(context)
        self._batches, self._contexts = [], []
        if self._sidecar is not None:
            llama.llama_model_free(self._sidecar)
            self._sidecar = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
