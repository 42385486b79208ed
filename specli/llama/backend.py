"""The only module that imports llama_cpp: load a GGUF, tokenize, decode a batch, rewind.

Everything here is the low-level C API of llama.cpp through llama-cpp-python's ctypes
bindings. Logits come back as numpy views of llama.cpp's own buffer (no copies): a view
is valid until the next decode on the same model. `decode_argmax` has llama.cpp choose
each row's argmax on the device that computed the logits (backend sampling) instead.
"""

from __future__ import annotations

import ctypes
import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

# Whether numpy's libraries were loaded before llama.cpp's (see _warn_import_order).
_NUMPY_FIRST = "numpy" in sys.modules

import llama_cpp as llama  # noqa: E402
import numpy as np  # noqa: E402

from specli.errors import ModelFileError, PromptError  # noqa: E402
from specli.llama import devices, interrupts, rpc  # noqa: E402


# What ggml's CUDA backend logged of its graphs (debug lines, which reach the silent log only):
# a decode whose graph matched the last one's ("CUDA Graph id N reused"), a graph captured after
# two decodes of one shape ("warmup complete"), and a change of shape after one was ("warmup
# reset"). Counted across the process: `cuda_graph_events`.
_GRAPH_LINES = ((b"CUDA Graph id", "reused"), (b"CUDA graph warmup complete", "captured"),
                (b"CUDA graph warmup reset", "reset"))
_graph_events = {"reused": 0, "captured": 0, "reset": 0}

# What llama.cpp logs of a context's caches as it creates them, in MiB, all devices together:
# an attention cache's size (two for a sliding-window model) and a recurrent or hybrid model's
# states with their snapshots. Summed since the last Model began creating its context.
_BUFFER_LINES = ((b"llama_kv_cache: size =", "kv"), (b"llama_memory_recurrent: size =", "recurrent"))
_buffers: dict[str, float] = {}


def _note_buffer(text: bytes) -> None:
    for marker, name in _BUFFER_LINES:
        if marker in text:
            try:
                mib = float(text.split(marker, 1)[1].split()[0])
            except (IndexError, ValueError):
                return
            _buffers[name] = _buffers.get(name, 0.0) + mib


@interrupts.register
def _silent_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    if text and b": size =" in text:
        _note_buffer(text)
    if text and b"CUDA" in text:
        for marker, event in _GRAPH_LINES:
            if marker in text:
                _graph_events[event] += 1
    return None


def cuda_graph_events() -> dict[str, int]:
    """How often ggml's CUDA backend reused, captured and reset a graph so far in this process,
    as its log says (nothing is counted while llama.cpp's log goes to stderr, --verbose)."""
    return dict(_graph_events)


@interrupts.register
def _stderr_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    """llama.cpp's own logger (--verbose: every line to stderr), noting its cache sizes too."""
    if text:
        if b": size =" in text:
            _note_buffer(text)
        os.write(2, text)
    return None


_SILENT_LOG = llama.llama_log_callback(_silent_log)
_STDERR_LOG = llama.llama_log_callback(_stderr_log)
_backend_ready = False


def log_callback(verbose: bool):
    """The log callback for llama.cpp's other libraries (mtmd): llama.cpp's own logger
    (stderr) when verbose, else silent."""
    return llama.llama_log_callback() if verbose else _SILENT_LOG


def init_backend(verbose: bool | None = None) -> None:
    """Start llama.cpp once per process; its log lines go to stderr only when verbose (None:
    as they went before, silent at first)."""
    global _backend_ready
    if verbose is not None or not _backend_ready:
        llama.llama_log_set(_STDERR_LOG if verbose else _SILENT_LOG, ctypes.c_void_p(0))
    if not _backend_ready:
        llama.llama_backend_init()
        interrupts.guard_callbacks()
        _warn_import_order()
        _backend_ready = True


def _warn_import_order() -> None:
    """On a CUDA build of llama-cpp-python 0.3.36 (an H200 with CUDA 13.0, 2026-11-26), every
    model load crashed (SIGSEGV in llama_model::print_info, inside C++ stream code that
    libggml-cuda carries a copy of) when numpy's libraries had loaded first; loaded after
    llama.cpp's, the same process ran. `import specli` first avoids it; a script that
    imported numpy before is told so once."""
    if _NUMPY_FIRST and "CUDA" in library_versions()["system_info"]:
        warnings.warn("numpy was imported before llama.cpp's CUDA libraries, which can crash model loads "
                      "(SIGSEGV) on some CUDA builds: import specli before numpy", RuntimeWarning, stacklevel=3)


def supports_gpu_offload() -> bool:
    """Whether this machine has a GPU to offload to. llama.cpp's own check also says yes for
    any build with RPC, which offloads to other machines only."""
    if not devices.rpc_supported():
        return bool(llama.llama_supports_gpu_offload())
    return bool(devices.local_accelerators())


# GCC's OpenMP runtime, whose pause frees the calling thread's team alone (LLVM's pauses the
# whole runtime, which another thread's decode may be using: left alone).
_LIBGOMP = "libgomp.so.1"


def release_threads() -> None:
    """Let go of the calling thread's OpenMP threads, where llama.cpp's CPU backend uses OpenMP.

    OpenMP keeps a team of threads for each thread that ran a parallel region (a decode), and
    once the teams hold more threads than the machine has CPUs, GCC's runtime cuts every
    team's spinning short: a decode from another thread then ran 2.6x slower (14 -> 38 ms a
    token on this 2-core machine). A command that decodes on one thread at load (a calibration)
    and on another after (a server's generations, the slots' shared steps) calls this once
    the first is done with llama.cpp. A no-op where there is no OpenMP; its next decode on
    this thread makes a team again."""
    if "OPENMP = 1" not in library_versions()["system_info"]:
        return
    try:
        pause = ctypes.CDLL(_LIBGOMP, mode=getattr(os, "RTLD_NOLOAD", 0) | os.RTLD_LAZY).omp_pause_resource_all
    except (OSError, AttributeError):  # not GCC's runtime, or not loaded
        return
    pause.argtypes, pause.restype = [ctypes.c_int], ctypes.c_int
    pause(1)  # omp_pause_soft: libgomp frees the calling thread's team (no parallel region runs here)


def library_versions() -> dict[str, str]:
    info = llama.llama_print_system_info()
    return {
        "llama_cpp_python": getattr(llama, "__version__", "unknown"),
        "system_info": info.decode("utf-8", "replace").strip() if info else "",
    }


def ggml_library() -> ctypes.CDLL | None:
    """ggml as llama-cpp-python loaded it (its device API has no Python bindings), or None."""
    try:
        from llama_cpp._ggml import libggml
    except (ImportError, OSError):
        return None
    return libggml


def check_gguf_file(path: Path) -> None:
    """Refuse, with a precise message, anything llama.cpp should not be asked to load.

    The header is parsed in pure Python (specli.llama.gguf_header) before llama.cpp sees the file:
    a truncated or corrupted GGUF becomes one line naming what is wrong, never an abort.
    """
    from specli.llama.gguf_header import read_header

    if not path.exists():
        raise ModelFileError(f"model file not found: {path}", "check the path, or use -m PAIR for a registry pair")
    if path.is_dir():
        raise ModelFileError(f"model path is a directory, not a GGUF file: {path}", "point at the .gguf file inside it")
    if not path.is_file():
        raise ModelFileError(f"model path is not a regular file: {path}", "point at a .gguf file")
    read_header(path)


devices.attach(devices.Binding(ggml_library(), init_backend, library_versions))


@dataclass(frozen=True)
class LoadSettings:
    """How a model is placed: GPU layers (-1: all), context and batch sizes, CPU threads."""

    gpu_layers: int = -1
    ctx_size: int = 4096
    batch_size: int = 512
    threads: int | None = None
    repack: bool = True  # llama.cpp's weight repacking (faster CPU kernels; batch-dependent rounding)
    rpc: tuple[str, ...] = ()  # llama.cpp RPC servers (HOST:PORT) that take layers before the local devices
    # A recurrent or hybrid model's states kept after each of its last decoded tokens, so that
    # `rewind` can remove up to this many of them (llama.cpp's n_rs_seq; others ignore it).
    # A command sizes it to what it drafts (specli.drafts.snapshots: none for plain decoding):
    # snapshots change what llama.cpp stores, not what it computes (specli never hands it a
    # batch it would split), so plain and drafted runs compute alike.
    recurrent_snapshots: int = 8
    # Sequences the context decodes side by side (llama.cpp's n_seq_max), each up to ctx_size
    # positions, in one unified KV cache of sequences x ctx_size cells (as Ollama's parallel
    # requests have; a cache split by sequence would split every mixed batch into many).
    sequences: int = 1


class _TensorPlacement(ctypes.Structure):
    """llama_model_tensor_buft_override (llama.h): tensors whose name matches a regex go to a buffer type."""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


# The output head: its weights (tied models reuse token_embd's), the matmul over the whole
# vocabulary, and so the logits rows specli reads back every step.
_OUTPUT_HEAD = b"^(output|token_embd)\\."


def _place_on_servers(params, servers: tuple[str, ...]) -> list:
    """Point a model's params at the RPC servers' devices, then the local accelerators, in
    the order llama.cpp's own --rpc gives them (remote first, to cross the network least).

    With no local GPU, the output head stays on this machine's CPU: otherwise it would go
    with the last layers to a server, and every verified row (a vocabulary of float32s)
    would cross the network instead of one hidden state. The sockets to the servers are
    watched (specli.llama.rpc.watch) from the first progress report of the load on. Returns the
    ctypes objects the params point into, to be kept alive until the model is loaded.
    """
    endpoints = rpc.parse_endpoints(",".join(servers))
    rpc.connect(servers)  # each answers in time, or one line naming it (not ggml's abort)
    placed = [device for endpoint in endpoints for device in devices.rpc_server_devices(str(endpoint))]
    local = devices.local_accelerators()
    device_list = (ctypes.c_void_p * (len(placed) + len(local) + 1))(*placed, *local, None)
    params.devices = ctypes.cast(device_list, ctypes.c_void_p)
    watched: list[int] = []

    @interrupts.register
    def progress(fraction: float, user_data: ctypes.c_void_p) -> bool:
        # The first call comes once the buffers are allocated: the connections exist, and the
        # weights (gigabytes, for a large model) are about to cross them.
        if not watched:
            watched.append(rpc.watch(endpoints))
        return True

    callback = llama.llama_progress_callback(progress)
    params.progress_callback = callback
    keep = [device_list, callback]
    if not local:
        overrides = (_TensorPlacement * 2)(_TensorPlacement(_OUTPUT_HEAD, devices.cpu_buffer_type()), _TensorPlacement(None, None))
        params.tensor_buft_overrides = ctypes.cast(overrides, ctypes.c_void_p)
        keep.append(overrides)
    return keep


# How many candidates the device keeps per row for decode_argmax (a top-k, in no order).
# Every maximum of a row with fewer maxima than this is among them, so the host breaks the
# tie as numpy's argmax does (the lowest id; ggml's CPU argmax takes the highest). A row
# whose candidates all tie may hide further maxima: it is read again from host logits.
DEVICE_CANDIDATES = 8


# Where a recurrent model's checkpoint is taken: this many tokens before a prompt's end, as
# llama-server takes its last, so that the next turn's prompt, which renders the answer
# without the generation prompt's last tokens (a template that drops earlier reasoning),
# still reaches back to one.
CHECKPOINT_TAIL = 4
STATE_CHECKPOINTS = 4  # the checkpoints a conversation keeps (chat, serve: Model.keep_checkpoints)
_PARTIAL = llama.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY  # a state's recurrent part only, not its KV cache


def _context_params(settings: LoadSettings, n_ctx_train: int):
    """llama_context_params for a model trained on `n_ctx_train` tokens of context."""
    params = llama.llama_context_default_params()
    per_sequence = min(settings.ctx_size, n_ctx_train) if n_ctx_train > 0 else settings.ctx_size
    params.n_ctx = per_sequence * settings.sequences
    params.n_seq_max = settings.sequences
    params.kv_unified = settings.sequences > 1  # one ubatch for any mix of sequences (a split cache splits by sequence)
    params.n_batch = params.n_ubatch = settings.batch_size
    params.n_threads = params.n_threads_batch = settings.threads or os.cpu_count() or 1
    params.no_perf = True
    params.n_rs_seq = settings.recurrent_snapshots
    # A device sampler (decode_argmax) may choose at every row of a batch, not only one.
    params.n_outputs_max_per_seq = settings.batch_size
    return params


class _Vocabulary:
    """A loaded model's tokens and chat template, read through llama.cpp's vocabulary: what
    Model offers besides decoding. Reads the handles and caches Model.__init__ sets."""

    _model: object
    _vocab: object
    _template_override: str | None
    _eog_cache: dict[int, bool]
    _piece_caches: tuple[dict[int, bytes], dict[int, bytes]]
    n_vocab: int

    @property
    def vocab_type(self) -> int:
        return int(llama.llama_vocab_type(self._vocab))

    @property
    def bos(self) -> int:
        return int(llama.llama_vocab_bos(self._vocab))

    @property
    def eos(self) -> int:
        return int(llama.llama_vocab_eos(self._vocab))

    @property
    def add_bos(self) -> bool:
        return bool(llama.llama_vocab_get_add_bos(self._vocab))

    @property
    def add_eos(self) -> bool:
        return bool(llama.llama_vocab_get_add_eos(self._vocab))

    def is_end_of_generation(self, token: int) -> bool:
        cached = self._eog_cache.get(token)
        if cached is None:
            cached = self._eog_cache[token] = bool(llama.llama_vocab_is_eog(self._vocab, token))
        return cached

    def end_of_generation_tokens(self) -> list[int]:
        """Every token id that ends a generation (EOS, end of turn, ...)."""
        return [token for token in range(self.n_vocab) if llama.llama_vocab_is_eog(self._vocab, token)]

    def token_table(self) -> list[tuple[bytes, bool]]:
        """Each token's bytes (special tokens as their text) and whether it is a control
        token (or a user-defined one spelled like one, <...>), in id order."""
        control, user = llama.LLAMA_TOKEN_ATTR_CONTROL, llama.LLAMA_TOKEN_ATTR_USER_DEFINED
        table = []
        for token in range(self.n_vocab):
            piece = self.piece(token, special=True)
            attr = llama.llama_vocab_get_attr(self._vocab, token)
            special = bool(attr & control) or bool(attr & user and piece.startswith(b"<") and piece.endswith(b">"))
            table.append((piece, special))
        return table

    def tokenizer_handles(self) -> tuple[int, int]:
        """(the vocabulary's address, llama_tokenize's address): for a library that tokenizes
        through llama.cpp itself (llguidance), valid while this model is loaded."""
        vocab = ctypes.cast(self._vocab, ctypes.c_void_p).value
        function = ctypes.cast(llama.llama_cpp._lib.llama_tokenize, ctypes.c_void_p).value
        return int(vocab or 0), int(function or 0)

    def token_text(self, token: int) -> bytes:
        return llama.llama_vocab_get_text(self._vocab, token) or b""

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        data = text.encode("utf-8")
        capacity = len(data) + 8
        buffer = (llama.llama_token * capacity)()
        count = llama.llama_tokenize(self._vocab, data, len(data), buffer, capacity, add_special, parse_special)
        if count < 0:
            capacity = -count
            buffer = (llama.llama_token * capacity)()
            count = llama.llama_tokenize(self._vocab, data, len(data), buffer, capacity, add_special, parse_special)
        return list(buffer[:count])

    def piece(self, token: int, special: bool = False) -> bytes:
        """The bytes a token stands for; special tokens (BOS, end of turn) render as nothing
        unless `special`."""
        cache = self._piece_caches[special]
        cached = cache.get(token)
        if cached is None:
            buffer = ctypes.create_string_buffer(64)
            size = llama.llama_token_to_piece(self._vocab, token, buffer, 64, 0, special)
            if size < 0:
                buffer = ctypes.create_string_buffer(-size)
                size = llama.llama_token_to_piece(self._vocab, token, buffer, -size, 0, special)
            cached = cache[token] = buffer.raw[:size]
        return cached

    def special_token(self, text: str) -> int | None:
        """The id of the special token written `text` (`[TOOL_CALLS]`, `<|python_tag|>`), or
        None where the vocabulary has no such token."""
        ids = self.tokenize(text, add_special=False, parse_special=True)
        plain = self.tokenize(text, add_special=False, parse_special=False)
        return ids[0] if len(ids) == 1 and ids != plain else None

    def chat_template(self) -> str | None:
        """The model's chat template (Jinja source): the one given at load, else the GGUF's."""
        if self._template_override is not None:
            return self._template_override
        template = llama.llama_model_chat_template(self._model, None)
        return template.decode("utf-8", "replace") if template else None

    def apply_builtin_chat_template(self, messages: list[dict[str, str]]) -> str | None:
        """Messages formatted by llama.cpp's built-in copy of the model's chat template, ready
        for the assistant's turn; None where llama.cpp does not recognise the template, the
        model has none, or a template was given at load (rendered from its Jinja source)."""
        template = llama.llama_model_chat_template(self._model, None)
        if not template or self._template_override is not None:
            return None
        chat = (llama.llama_chat_message * len(messages))()
        encoded = [(m["role"].encode(), m["content"].encode()) for m in messages]
        for i, (role, content) in enumerate(encoded):
            chat[i].role = role
            chat[i].content = content
        size = sum(len(r) + len(c) for r, c in encoded) * 2 + 256
        buffer = ctypes.create_string_buffer(size)
        written = llama.llama_chat_apply_template(template, chat, len(messages), True, buffer, size)
        if written > size:
            buffer = ctypes.create_string_buffer(written)
            written = llama.llama_chat_apply_template(template, chat, len(messages), True, buffer, written)
        return buffer.raw[:written].decode("utf-8", "replace") if written >= 0 else None


class Model(_Vocabulary):
    """One GGUF model with one llama.cpp context: loading, decoding and rewinding sequence 0
    (its tokens and chat template: _Vocabulary); with settings.sequences above 1, a decode of
    several sequences' rows at once (decode_sequences) and their own rewinds (forget). `load_mtp`:
    with the GGUF's NextN (multi-token prediction) layers, which llama.cpp skips otherwise
    (specli.llama.mtp drafts with them)."""

    checkpoint_tail = CHECKPOINT_TAIL  # where a prompt's checkpoint is taken (a slot's too)

    def __init__(self, path: Path | str, settings: LoadSettings = LoadSettings(), *, verbose: bool = False,
                 chat_template: str | None = None, load_mtp: bool = False) -> None:
        self.path = Path(path)
        self._template_override = chat_template  # --chat-template-file: in place of the GGUF's
        check_gguf_file(self.path)
        init_backend(verbose)
        self._model = None
        self._ctx = None
        self._batch = None
        self._device_sampler = None  # the chain sequence 0 samples with (decode_argmax, decode_greedy)
        self._device_sampling = ""  # which: "candidates" or "greedy" ("": none, logits come to the host)
        model_params = llama.llama_model_default_params()
        model_params.n_gpu_layers = settings.gpu_layers
        model_params.use_extra_bufts = settings.repack
        model_params.load_mtp = load_mtp  # (a build without the field ignores it: specli.llama.mtp checks first)
        keep = _place_on_servers(model_params, settings.rpc) if settings.rpc else []
        self._model = llama.llama_model_load_from_file(str(self.path).encode(), model_params)
        del keep
        if not self._model:
            raise ModelFileError(
                f"llama.cpp could not load {self.path}",
                "the file may be truncated, corrupted or of an architecture this llama.cpp does not know; "
                "rerun with --verbose for llama.cpp's reason",
            )
        self._vocab = llama.llama_model_get_vocab(self._model)
        # Every layer and the output head on a local GPU (llama.cpp offloads the output with the
        # layers once n_gpu_layers exceeds the layer count): its decodes replay CUDA graphs, and
        # a row costs little next to a step.
        layers = int(llama.llama_model_n_layer(self._model))
        self.on_gpu = supports_gpu_offload() and (settings.gpu_layers < 0 or settings.gpu_layers > layers)
        self.n_vocab = int(llama.llama_vocab_n_tokens(self._vocab))
        self.n_ctx_train = int(llama.llama_model_n_ctx_train(self._model))
        self.n_swa = int(llama.llama_model_n_swa(self._model))  # a sliding window's length (0: none)
        ctx_params = _context_params(settings, self.n_ctx_train)
        _buffers.clear()
        self._ctx = llama.llama_init_from_model(self._model, ctx_params)
        self._cache_mib = dict(_buffers)  # see cache_memory
        if not self._ctx:
            raise ModelFileError(
                f"llama.cpp could not create a context for {self.path} (n_ctx={ctx_params.n_ctx})",
                "try a smaller --ctx-size",
            )
        if settings.rpc:  # and the context's buffers (the KV cache) may have opened a connection anew
            rpc.watch(rpc.parse_endpoints(",".join(settings.rpc)))
        # llama.cpp rounds the KV cache up (to 256 cells at least) but caps a decode at the
        # batch size it was given: holding n_ctx to what was asked keeps every decode within
        # both, and makes --ctx-size exact.
        self.sequences = settings.sequences
        held = llama.llama_n_ctx_seq(self._ctx) if self.sequences > 1 else llama.llama_n_ctx(self._ctx)
        self.n_ctx = min(int(held), int(ctx_params.n_ctx) // self.sequences)  # each sequence's
        self.batch_size = min(settings.batch_size, int(llama.llama_n_batch(self._ctx)))
        self._init_recurrent(settings)
        self._memory = llama.llama_get_memory(self._ctx)
        self._init_batch(self.batch_size)
        self._piece_caches: tuple[dict[int, bytes], dict[int, bytes]] = ({}, {})  # by `special`
        self._eog_cache: dict[int, bool] = {}
        self.n_past = 0  # tokens held in the KV cache, positions [0, n_past)
        self._logits_view: np.ndarray | None = None  # see _logits_rows
        self._logits_address = 0
        self._decodes = 0  # decodes so far: what a DeviceChoices was read from
        self._last_batch: tuple[list[int], bool] = ([], False)  # the last llama_decode's tokens, all rows out
        # After each llama_decode, while its outputs are readable: (first position, token count);
        # after a decode_sequences, each part's (sequence, first position, token count), in batch order.
        self.on_decode: Callable[[int, int], None] | None = None
        self.on_sequences: Callable[[list[tuple[int, int, int]]], None] | None = None

    @property
    def model_handle(self):
        """llama.cpp's model (a llama_model pointer), for specli.llama.mtp."""
        return self._model

    @property
    def context_handle(self):
        """llama.cpp's context (a llama_context pointer), for specli.llama.mtp."""
        return self._ctx

    # --- batch and decode ---------------------------------------------------

    def _init_batch(self, capacity: int) -> None:
        self._batch = llama.llama_batch_init(capacity, 0, 1)
        self._batch_capacity = capacity
        batch = self._batch
        # numpy views over the C arrays: filling a batch is a few vectorised stores.
        self._batch_tokens = np.ctypeslib.as_array(batch.token, shape=(capacity,))
        self._batch_pos = np.ctypeslib.as_array(batch.pos, shape=(capacity,))
        self._batch_logits = np.ctypeslib.as_array(batch.logits, shape=(capacity,))
        n_seq_id = np.ctypeslib.as_array(batch.n_seq_id, shape=(capacity,))
        n_seq_id[:] = 1
        for i in range(capacity):
            batch.seq_id[i][0] = 0

    def decode(self, tokens: list[int], *, all_logits: bool = False,
               outputs: Sequence[bool] | None = None) -> np.ndarray:
        """Append tokens to the KV cache; return logits rows (one per token, or only the last;
        `outputs`: one per token flagged True, in order, and the last token's always). A row
        with no output costs the model's body only, not its output head.

        The returned array is a view of llama.cpp's buffer, valid until the next decode.
        """
        self._sample_on_device("")
        if outputs is not None:
            self._decode(tokens, True, outputs)
            return self._logits_rows(int(sum(bool(flag) for flag in outputs[: len(tokens) - 1])) + 1)
        self._decode(tokens, all_logits)
        return self._logits_rows(len(tokens) if all_logits else 1)

    def decode_argmax(self, tokens: list[int], *, all_rows: bool = False) -> DeviceChoices:
        """Append tokens to the KV cache; return the argmax of each row (or only the last's),
        chosen on the device that computed the logits: the host reads DEVICE_CANDIDATES
        (id, logit) pairs per row, never a vocabulary row. Every token is the one
        `int(np.argmax(row))` gives for the same batch through `decode`, ties included.

        Rows are read when indexed; the result is valid until the next decode.
        """
        self._sample_on_device("candidates")
        self._decode(tokens, all_rows)
        return DeviceChoices(self, len(tokens) if all_rows else 1)

    def decode_greedy(self, tokens: list[int]) -> int:
        """Append tokens to the KV cache; return the last row's argmax as the device takes it
        (ggml's argmax: a tie goes to whichever maximum the device's reduction keeps, not
        always the lowest id, so only for a draft, whose tokens the target verifies). No logits
        row crosses to the host."""
        self._sample_on_device("greedy")
        self._decode(tokens, False)
        token = int(llama.llama_get_sampled_token_ith(self._ctx, len(self._last_batch[0]) - 1))
        if token < 0:
            raise DecodeError(-1, self.path, "wrote no token for the device's greedy choice")
        return token

    def _decode(self, tokens: list[int], all_rows: bool, outputs: Sequence[bool] | None = None) -> None:
        if not tokens:
            raise ValueError("decode needs at least one token")
        if self.n_past + len(tokens) > self.n_ctx:
            raise ContextFullError(self.n_ctx)
        if all_rows and len(tokens) > self._batch_capacity:
            raise ValueError("all_logits decode is limited to one batch")
        if self._checkpoints_kept and outputs is None and not all_rows and len(tokens) > CHECKPOINT_TAIL:
            # a prompt (only its last row is wanted): its state CHECKPOINT_TAIL tokens before the end
            head, tokens = tokens[:-CHECKPOINT_TAIL], tokens[-CHECKPOINT_TAIL:]
            kept, self._checkpoints_kept = self._checkpoints_kept, 0
            try:
                self._decode(head, False)
            finally:
                self._checkpoints_kept = kept
            self.checkpoint(0, self.n_past, self._checkpoints_kept)
        self._decodes += 1
        start = 0
        while start < len(tokens):
            chunk = tokens[start : start + self._batch_capacity]
            n = len(chunk)
            last_chunk = start + n == len(tokens)
            self._batch_tokens[:n] = chunk
            self._batch_pos[:n] = np.arange(self.n_past, self.n_past + n)
            if outputs is not None:
                self._batch_logits[:n] = np.asarray(outputs[start : start + n], dtype=bool)
            else:
                self._batch_logits[:n] = 1 if all_rows else 0
            if last_chunk:
                self._batch_logits[n - 1] = 1
            self._batch.n_tokens = n
            status = llama.llama_decode(self._ctx, self._batch)
            if status != 0:
                self.rewind(self.n_past)  # drop whatever a failed decode left behind
                raise DecodeError(status, self.path)
            if self.on_decode is not None:
                self.on_decode(self.n_past, n)
            self.n_past += n
            start += n
            if self.recurrent:  # snapshots after the last `snapshots` tokens, each but the batch's last
                self._record.extend(chunk)
                self._reach = min(self.snapshots, n - 1)
        self._last_batch = (chunk, all_rows)

    def took(self, first: int, positions: int) -> None:
        """Count positions [first, first + positions) that another binding decoded into
        sequence 0 after n_past (specli.llama.vision: an image's embeddings). A recurrent model
        holds them as positions a rewind cannot decode again (rewind then empties the cache)."""
        if first != self.n_past:
            raise ValueError(f"positions decoded at {first}, not at n_past ({self.n_past})")
        self.n_past += positions
        if self.recurrent:
            self._record.extend([-1] * positions)
            self._reach = 0

    def detach_sampler(self) -> None:
        """Let the next decode's logits come to the host (before another binding decodes)."""
        self._sample_on_device("")

    def decode_sequences(self, parts: Sequence[tuple[int, int, list[int], Sequence[bool]]]) -> list[np.ndarray]:
        """One llama_decode of several sequences' rows: each part is (sequence, its first
        position, its tokens, which of them want a logits row), at most batch_size rows in
        all. Returns each part's logits rows, views of llama.cpp's buffer valid until the next
        decode. Sequence 0's own bookkeeping (n_past, decode, rewind) is not touched: a caller
        that decodes sequences here keeps their positions itself."""
        total = sum(len(tokens) for _, _, tokens, _ in parts)
        if total == 0 or total > self._batch_capacity:
            raise ValueError(f"decode_sequences takes 1 to {self._batch_capacity} rows, not {total}")
        self._sample_on_device("")
        batch, at, counts = self._batch, 0, []
        for sequence, first, tokens, outputs in parts:
            n = len(tokens)
            self._batch_tokens[at : at + n] = tokens
            self._batch_pos[at : at + n] = np.arange(first, first + n)
            self._batch_logits[at : at + n] = np.asarray(outputs, dtype=bool)
            for i in range(at, at + n):
                batch.seq_id[i][0] = sequence
            counts.append(int(sum(bool(flag) for flag in outputs)))
            at += n
        batch.n_tokens = total
        self._decodes += 1
        status = llama.llama_decode(self._ctx, batch)
        for i in range(total):  # sequence 0's decodes fill only tokens, positions and flags
            batch.seq_id[i][0] = 0
        if status != 0:
            for sequence, first, _, _ in parts:
                llama.llama_memory_seq_rm(self._memory, sequence, first, -1)
            raise DecodeError(status, self.path)
        if self.on_sequences is not None:
            self.on_sequences([(sequence, first, len(tokens)) for sequence, first, tokens, _ in parts])
        rows = self._logits_rows(max(1, sum(counts)))
        offsets = np.cumsum([0, *counts])
        return [rows[offsets[i] : offsets[i + 1]] for i in range(len(parts))]

    def forget(self, sequence: int, n_keep: int) -> None:
        """Remove a sequence's cached positions from n_keep on (decode_sequences' rewind)."""
        if not llama.llama_memory_seq_rm(self._memory, sequence, n_keep, -1):
            raise DecodeError(-1, self.path, f"could not remove positions {n_keep}.. of sequence {sequence}")
        self._drop_checkpoints(sequence, n_keep)

    def share(self, source: int, sequence: int, n: int) -> None:
        """`sequence` holds `source`'s positions [0, n) too: the same cells of the one unified
        cache, tagged with both sequences (llama.cpp copies no data), kept while either holds
        them. For an attention cache only (a recurrent state is one, at its end)."""
        llama.llama_memory_seq_cp(self._memory, source, sequence, 0, n)

    # --- backend sampling (decode_argmax) --------------------------------------

    def _sample_on_device(self, mode: str) -> None:
        """Attach (or detach: "") the device sampler of sequence 0: "candidates" keeps
        DEVICE_CANDIDATES (id, logit) pairs a row, "greedy" one token id. While one is
        attached, llama.cpp copies no logits to the host for the sequence's rows; each attach
        or detach re-plans the compute graph, so it happens only when the path changes."""
        if mode == self._device_sampling:
            return
        if self._device_sampler is not None:
            llama.llama_set_sampler(self._ctx, 0, None)
            llama.llama_sampler_free(self._device_sampler)
            self._device_sampler, self._device_sampling = None, ""
        if not mode:
            return
        chain = llama.llama_sampler_chain_init(llama.llama_sampler_chain_default_params())
        sampler = (llama.llama_sampler_init_greedy() if mode == "greedy"
                   else llama.llama_sampler_init_top_k(min(DEVICE_CANDIDATES, self.n_vocab)))
        llama.llama_sampler_chain_add(chain, sampler)
        attached = llama.llama_set_sampler(self._ctx, 0, chain)
        # "+name": its ggml ops run on the output device; "-name": they do not, and the rows
        # would come back with neither logits nor a choice.
        name = llama.llama_sampler_name(llama.llama_sampler_chain_get(chain, 0)) if attached else b""
        if not name.startswith(b"+"):
            if attached:
                llama.llama_set_sampler(self._ctx, 0, None)
            llama.llama_sampler_free(chain)
            raise DeviceSamplingError(self.path, name.decode(errors="replace") or "llama_set_sampler refused the sampler")
        self._device_sampler, self._device_sampling = chain, mode

    def _device_choice(self, index: int) -> int | None:
        """Row `index`'s argmax from the device's candidates; None where the candidates
        cannot settle it (all of them tie, or the device wrote none)."""
        ctx = self._ctx
        count = int(llama.llama_get_sampled_logits_count_ith(ctx, index))
        logits_pointer = llama.llama_get_sampled_logits_ith(ctx, index)
        if count == 0 or not logits_pointer or count != int(llama.llama_get_sampled_candidates_count_ith(ctx, index)):
            return None
        logits = logits_pointer[:count]
        ids = llama.llama_get_sampled_candidates_ith(ctx, index)[:count]
        best = max(logits)
        tied = [token for token, logit in zip(ids, logits) if logit == best]
        if len(tied) == count < self.n_vocab:
            return None
        return min(tied)

    def _argmax_on_host(self) -> list[int]:
        """The last decode's batch decoded again on the host path (the same batch gives the
        same logits, bit for bit), and each output row's argmax as numpy takes it."""
        tokens, all_rows = self._last_batch
        self.rewind(self.n_past - len(tokens))
        rows = self.decode(tokens, all_logits=all_rows)
        return [int(np.argmax(row)) for row in rows]

    def _logits_rows(self, rows: int) -> np.ndarray:
        """The last decode's logits rows, as a view of llama.cpp's output buffer.

        The view is built once per buffer (llama.cpp moves the buffer only when it grows)
        and sliced after that, because building one costs far more than slicing it
        (docs/design.md, "The cost model"). It never spans more rows than
        llama.cpp has written at that address, so it covers allocated memory only.
        """
        pointer = llama.llama_get_logits(self._ctx)
        address = ctypes.addressof(pointer.contents)
        view = self._logits_view
        if view is None or address != self._logits_address or rows > view.shape[0]:
            view = self._logits_view = np.ctypeslib.as_array(pointer, shape=(rows, self.n_vocab))
            self._logits_address = address
        return view[:rows]

    def _init_recurrent(self, settings: LoadSettings) -> None:
        """A recurrent or hybrid model's state holds every token it read: a rewind restores a
        snapshot llama.cpp kept after one of the last decode's tokens (see rewind)."""
        self.recurrent = bool(llama.llama_model_is_recurrent(self._model) or llama.llama_model_is_hybrid(self._model))
        self._snapshots_asked = settings.recurrent_snapshots
        self.snapshots = int(llama.llama_n_rs_seq(self._ctx)) if self.recurrent else 0
        self._record: list[int] = []  # a recurrent model's cached tokens, to decode again (rewind)
        self._reach = 0  # how many positions a snapshot can take back now (recurrent only)
        self._checkpoints_kept = 0  # keep_checkpoints
        # By sequence: its checkpoints (position, its recurrent state), oldest first.
        self._states: dict[int, list[tuple[int, ctypes.Array]]] = {}

    def keep_checkpoints(self, count: int) -> None:
        """A recurrent or hybrid model's states kept on the host (llama-server's context
        checkpoints; others ignore it): each prompt (a decode that wants its last row only) is
        decoded up to CHECKPOINT_TAIL tokens before its end, its state kept, then the rest; the
        last `count` are kept, so that a later prompt that shares the conversation restores one
        and decodes on from there, not from the first token. 0: prompts decode in one piece
        again (an exact request's, as `run --exact` decodes them); the kept states stay.
        (Sequence 0's; a slot keeps its sequence's through `checkpoint`.)"""
        self._checkpoints_kept = count if self.recurrent else 0
        if count:
            self._states[0] = self._states.get(0, [])[-count:]

    def checkpoint(self, sequence: int, at: int, count: int) -> None:
        """Keep `sequence`'s recurrent state, which stands at position `at`, on the host, with
        at most `count` - 1 kept before it (the oldest go)."""
        state = self._sequence_state(sequence)
        if state is None:
            return
        kept = [(p, data) for p, data in self._states.get(sequence, []) if p != at]
        self._states[sequence] = (kept + [(at, state)])[-count:]

    def restore_checkpoint(self, sequence: int, n_keep: int) -> int:
        """Put `sequence` back to its latest checkpoint at or before n_keep, its attention
        cache dropped from there on: the checkpoint's position (0: there is none, or llama.cpp
        refused it, and the sequence is to be emptied)."""
        states = self._states.get(sequence, [])
        for at, state in reversed(states):
            if 0 < at <= n_keep:
                if self._restore_state(sequence, state, at):
                    self._states[sequence] = [(p, data) for p, data in states if p <= at]
                    return at
                self._states[sequence] = []
                break
        return 0

    def checkpoint_positions(self, sequence: int = 0) -> list[int]:
        """Where the recurrent states kept on the host stand (keep_checkpoints), oldest first."""
        return [at for at, _ in self._states.get(sequence, [])]

    def _drop_checkpoints(self, sequence: int, n_keep: int) -> None:
        """Forget `sequence`'s checkpoints past n_keep (its cache no longer holds them)."""
        if self._states.get(sequence):
            self._states[sequence] = [(at, state) for at, state in self._states[sequence] if at <= n_keep]

    def _sequence_state(self, sequence: int) -> ctypes.Array | None:
        """A copy of a sequence's recurrent state (not its attention cache) on the host; None
        where llama.cpp gives none."""
        size = int(llama.llama_state_seq_get_size_ext(self._ctx, sequence, _PARTIAL))
        state = (ctypes.c_uint8 * size)()
        if size == 0 or int(llama.llama_state_seq_get_data_ext(self._ctx, state, size, sequence, _PARTIAL)) != size:
            return None
        return state

    def _restore_state(self, sequence: int, state: ctypes.Array, at: int) -> bool:
        """Put back a sequence's recurrent state taken at position `at` and drop its attention
        cache from `at` on (False: llama.cpp refused)."""
        restored = int(llama.llama_state_seq_set_data_ext(self._ctx, state, len(state), sequence, _PARTIAL))
        return bool(restored) and bool(llama.llama_memory_seq_rm(self._memory, sequence, at, -1))

    def _restore(self, n_keep: int) -> int:
        """Sequence 0 back at its latest checkpoint at or before n_keep: its position (0: none)."""
        at = self.restore_checkpoint(0, n_keep)
        if at:
            del self._record[at:]
            self.n_past, self._reach = at, 0
        return at

    def cache_memory(self) -> dict[str, int]:
        """What llama.cpp allocated for this context's caches, as it logs them: the attention
        cache (`kv_cache_bytes`) and, on a recurrent or hybrid model, its states with their
        snapshots (`recurrent_bytes`, for `recurrent_snapshots` snapshots a sequence)."""
        memory = {f"{'kv_cache' if name == 'kv' else name}_bytes": round(mib * 2**20)
                  for name, mib in self._cache_mib.items()}
        if self.recurrent:
            memory["recurrent_snapshots"] = self.snapshots
        return memory

    @property
    def max_rewind(self) -> int | None:
        """The most positions `rewind` takes back after a decode of more tokens than that
        without decoding anything again: None for a model whose cache is attention only (any),
        a recurrent or hybrid model's snapshots (0: none)."""
        return self.snapshots if self.recurrent else None

    @property
    def rewind_problem(self) -> str | None:
        """Why a rejected draft cannot be taken back from this model's cache (None: it can)."""
        if self.max_rewind != 0:
            return None
        if self._snapshots_asked <= 0:
            return f"{self.path.name} has recurrent layers and was loaded without snapshots of their state"
        return (f"{self.path.name} has recurrent layers whose state this llama.cpp cannot roll back "
                "(it keeps no snapshots for its architecture)")

    def rewind(self, n_keep: int) -> None:
        """Forget every cached position from n_keep on (rejected draft tokens).

        A recurrent or hybrid model restores the snapshot llama.cpp kept after position
        n_keep - 1, which exists only within the last decode's batch, for its last
        `snapshots` tokens but its last one, and once: a rewind further than that (a cached
        prompt's prefix, a batch decoded again) restores the latest checkpoint at or before
        n_keep (keep_checkpoints) or else empties the cache, and decodes the kept
        tokens from there again; where they hold an image, it leaves the cache there."""
        if self.recurrent and 0 < n_keep < self.n_past and self.n_past - n_keep > self._reach:
            kept = self._record[:n_keep]
            start = self._restore(n_keep)  # a checkpoint on the way (chat, serve), else the start
            if start == 0:
                self.rewind(0)
            again = kept[start:]
            if again and min(again) >= 0:  # (an image's positions are not decoded again: n_past stays)
                self._decode(again, False)
            return
        if not llama.llama_memory_seq_rm(self._memory, 0, n_keep, -1):
            # Sliding-window caches keep n_swa + n_ubatch cells, enough for any rollback of a
            # draft (at most batch_size tokens): reaching this means the cache is not in sync.
            raise DecodeError(-1, self.path, f"could not remove positions {n_keep}.. from the KV cache")
        if self.recurrent and n_keep < self.n_past:
            del self._record[n_keep:]
            self._reach = 0  # llama.cpp restores one snapshot, at the next decode
            self._drop_checkpoints(0, n_keep)
        self.n_past = min(self.n_past, n_keep)

    # --- lifetime -----------------------------------------------------------

    def close(self) -> None:
        if self._device_sampler is not None:
            self._sample_on_device("")
        if self._batch is not None:
            llama.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            llama.llama_free(self._ctx)
            self._ctx = None
        if self._model:
            llama.llama_model_free(self._model)
            self._model = None

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


class DeviceChoices(Sequence[int]):
    """The argmax of each output row of one decode_argmax, read from the device's candidates
    when indexed (rows after a rejection are never read). A row the candidates cannot settle
    has the whole batch decoded again on the host path, once, for every row's argmax."""

    def __init__(self, model: Model, rows: int) -> None:
        self._model, self._rows = model, rows
        self._decode = model._decodes
        self._tokens, _ = model._last_batch
        self._from_host: list[int] | None = None

    def __len__(self) -> int:
        return self._rows

    def __getitem__(self, i):  # type: ignore[override]
        if not -self._rows <= i < self._rows:
            raise IndexError(i)
        i %= self._rows
        if self._model._decodes != self._decode:
            raise RuntimeError("device choices are read after a later decode")
        if self._from_host is None:
            # Output rows are indexed by their place in the last llama_decode's batch.
            choice = self._model._device_choice(len(self._tokens) - self._rows + i)
            if choice is not None:
                return choice
            self._from_host = self._model._argmax_on_host()
            self._decode = self._model._decodes
        return self._from_host[i]


class ContextFullError(PromptError):
    def __init__(self, n_ctx: int) -> None:
        super().__init__(f"the context is full ({n_ctx} tokens)", "raise --ctx-size or shorten the prompt")
        self.n_ctx = n_ctx


class DeviceSamplingError(ModelFileError):
    def __init__(self, path: Path, sampler: str) -> None:
        super().__init__(f"llama.cpp cannot choose the argmax on {path.name}'s output device ({sampler})",
                         "verify on the host (leave out --verify-on-device)")


class DecodeError(ModelFileError):
    def __init__(self, status: int, path: Path, what: str = "failed to decode a batch") -> None:
        super().__init__(f"llama.cpp {what} with {path.name} (status {status})")
        self.status = status


