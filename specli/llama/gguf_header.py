"""Read a GGUF file's header in pure Python and check that it describes the file it is in.

llama.cpp checks GGUF files too, but its messages go to a log specli silences, and some
malformed files still reach one of its asserts (an abort, not an error). This check runs
first and mirrors its rules: magic and version, every key and value, every tensor's
name, shape, type and place in the data section, the data section within the file;
then what llama.cpp asserts rather than reports: unique token texts, byte tokens for a
SentencePiece vocabulary, layer and expert counts within its limits. Only the header is
read (the file is memory-mapped), so a 2 GB model costs what its header costs.

Layout (little-endian): magic "GGUF", u32 version, u64 tensor count, u64 key count; the
keys (string, u32 value type, value); the tensor infos (string name, u32 n_dims, i64
dims, u32 ggml type, u64 offset); padding to `general.alignment` (default 32); the
tensor data, each tensor at its offset from the start of the data section, in order.

The format's tables (value types; ggml tensor types and their block sizes) are gguf-py's,
so a type ggml adds arrives with the package. Its GGUFReader is not used to read: it
makes an object per array item, 16 s for Gemma 3's 262k-token vocabulary where this
reader takes 0.3 s, and every model is checked before it loads.
"""

from __future__ import annotations

import mmap
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import gguf

from specli.errors import ModelFileError

GGUF_MAGIC = struct.pack("<I", gguf.GGUF_MAGIC)  # b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = gguf.GGUF_DEFAULT_ALIGNMENT
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_NAME_BYTES = 63  # GGML_MAX_NAME is 64, terminating zero included
MAX_KEY_BYTES = 65_535
MAX_KEPT_ITEMS = 4096  # numeric arrays up to this length keep their values
REDOWNLOAD_HINT = "the file is damaged or incomplete; download it again"

# Hyperparameters llama.cpp asserts on (an abort, not an error) while loading any
# architecture: llama-model.cpp, load_hparams. The limits are this llama.cpp's.
MAX_LAYERS = 512  # LLAMA_MAX_LAYERS
MAX_EXPERTS = 1024  # LLAMA_MAX_EXPERTS
ROPE_SCALING_TYPES = ("none", "linear", "yarn", "longrope")

# GGUF value types (gguf-py's names and ids), with the struct format each scalar reads as.
ValueType = gguf.GGUFValueType
STRING, ARRAY, UINT32, INT32, FLOAT32 = (ValueType.STRING, ValueType.ARRAY, ValueType.UINT32, ValueType.INT32,
                                         ValueType.FLOAT32)
_SCALAR_FORMATS = {ValueType.UINT8: "<B", ValueType.INT8: "<b", ValueType.UINT16: "<H", ValueType.INT16: "<h",
                   ValueType.UINT32: "<I", ValueType.INT32: "<i", ValueType.FLOAT32: "<f", ValueType.BOOL: "<?",
                   ValueType.UINT64: "<Q", ValueType.INT64: "<q", ValueType.FLOAT64: "<d"}
VALUE_TYPES = {int(kind): kind.name.lower() for kind in ValueType}


def _value_size(value_type: int) -> int | None:
    """Bytes of one value of the type; None for strings and arrays."""
    fmt = _SCALAR_FORMATS.get(ValueType(value_type))
    return None if fmt is None else struct.calcsize(fmt)


# ggml tensor types: gguf-py's table (name, elements and bytes per block). An id below the
# largest it names that it does not name was removed from ggml: files using one do not load.
GGML_TYPES: dict[int, tuple[str, int, int]] = {int(kind): (kind.name, *gguf.GGML_QUANT_SIZES[kind])
                                               for kind in gguf.GGMLQuantizationType if kind in gguf.GGML_QUANT_SIZES}
REMOVED_GGML_TYPES = frozenset(set(range(max(GGML_TYPES))) - set(GGML_TYPES))

# Keys llama.cpp reads without checking their type (an assert, or reads past the array's
# end): their expected type, and for per-token arrays, that there is one entry per token.
TOKENS_KEY = "tokenizer.ggml.tokens"
_KNOWN_ARRAYS = {
    TOKENS_KEY: STRING,
    "tokenizer.ggml.merges": STRING,
    "tokenizer.ggml.scores": FLOAT32,
    "tokenizer.ggml.token_type": INT32,
}
_PER_TOKEN_KEYS = ("tokenizer.ggml.scores", "tokenizer.ggml.token_type")

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")


class HeaderCutShort(ModelFileError):
    """A read past the end of the bytes there are: a truncated file, or (metadata_from_bytes)
    the first bytes of one, too few for its header."""


@dataclass(frozen=True)
class ArrayValue:
    """An array value, summarised: its item type and length (token lists are 100k+ long),
    and the values themselves for short numeric arrays (per-layer settings)."""

    item_type: str
    count: int
    values: tuple | None = field(default=None, repr=False)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # ggml order: the first dimension is the contiguous one
    type: int
    offset: int  # from the start of the data section
    size: int | None  # bytes; None for a ggml type this table does not know


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    metadata: dict[str, object]  # scalars and strings as Python values, arrays as ArrayValue
    tensors: list[TensorInfo] = field(repr=False)
    alignment: int
    data_start: int
    file_size: int


class _Reader:
    """A cursor over the mapped file; every read is bounds-checked against the file size."""

    def __init__(self, path: Path, data, size: int) -> None:
        self.path, self.data, self.size = path, data, size
        self.pos = 0

    def fail(self, problem: str) -> ModelFileError:
        return ModelFileError(f"{self.path} is not a valid GGUF file: {problem}", REDOWNLOAD_HINT)

    def cut_short(self, problem: str) -> ModelFileError:
        """A read past the end: a cut-off file, or a corrupted length that points past it."""
        return HeaderCutShort(f"{self.path} is truncated or corrupted: {problem}", REDOWNLOAD_HINT)

    def take(self, n: int, what: str) -> int:
        """Advance over n bytes; return where they start."""
        start, end = self.pos, self.pos + n
        if end > self.size:
            raise self.cut_short(f"{what} needs bytes {start}-{end} but the file has {self.size} bytes")
        self.pos = end
        return start

    def u32(self, what: str) -> int:
        return _U32.unpack_from(self.data, self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return _U64.unpack_from(self.data, self.take(8, what))[0]

    def i64(self, what: str) -> int:
        return _I64.unpack_from(self.data, self.take(8, what))[0]

    def raw_string(self, what: str, limit: int | None = None) -> bytes:
        length = self.u64(f"the length of {what}")
        if limit is not None and length > limit:
            raise self.fail(f"{what} is {length} bytes long (at most {limit} expected)")
        start = self.take(length, f"{what} ({length} bytes)")
        return self.data[start : self.pos]

    def strings(self, count: int, what: str, *, keep: bool) -> tuple[bytes, ...] | None:
        """Walk `count` strings (a 262k-token vocabulary is one array); their bytes if `keep`."""
        data, size, pos, unpack = self.data, self.size, self.pos, _U64.unpack_from
        kept: list[bytes] = []
        for i in range(count):
            if pos + 8 > size:
                self.pos = pos
                self.take(8, f"the length of item {i} of {what}")
            start = pos + 8
            pos = start + unpack(data, pos)[0]
            if pos > size:
                raise self.cut_short(f"item {i} of {what} ends at byte {pos} but the file has {size} bytes")
            if keep:
                kept.append(data[start:pos])
        self.pos = pos
        return tuple(kept) if keep else None


def read_header(path: Path | str) -> GGUFHeader:
    """Parse and check the header of the GGUF file at `path`; raise ModelFileError if it is bad.

    A command reads one file's header several times (the check before loading, MTP's and the
    projector's questions): a header parsed before is handed out again while the file is the
    one it was read from (same inode, size and modification time). A file modified within a
    second of its parse is parsed again, as git treats a racily clean file: a rewrite inside
    the clock's granularity could keep all three. The header handed out is shared: read it,
    never change it.
    """
    path = Path(path)
    try:
        facts = path.stat()
    except OSError:
        return _mapped(path, _parse)  # (its one-line error)
    key = (str(path.absolute()), facts.st_dev, facts.st_ino, facts.st_size, facts.st_mtime_ns)
    with _HEADERS_LOCK:
        kept = _HEADERS.get(key)
    if kept is not None and kept[0] - facts.st_mtime_ns > _RACY_NS:
        return kept[1]
    parsed = time.time_ns()
    header = _mapped(path, _parse)
    with _HEADERS_LOCK:
        if len(_HEADERS) >= _HEADERS_KEPT:
            _HEADERS.pop(next(iter(_HEADERS)))
        _HEADERS[key] = (parsed, header)
    return header


_HEADERS: dict[tuple, tuple[int, GGUFHeader]] = {}  # read_header's: by file, (when parsed, header)
_HEADERS_LOCK = threading.Lock()  # (servers and the finder read headers from several threads)
_HEADERS_KEPT = 16
_RACY_NS = 1_000_000_000


def read_metadata(path: Path | str) -> dict[str, object]:
    """Only the header's keys and values (what `specli list --local` shows), read as read_header
    reads them but without the tensor infos and the checks of the whole file: ModelFileError
    for a file that is not GGUF or whose keys are cut short."""
    return _mapped(Path(path), _keys)


def metadata_from_bytes(data: bytes, name: str) -> dict[str, object]:
    """The header keys of a GGUF whose first bytes are `data` (a range request's answer):
    HeaderCutShort where they run past them."""
    if data[:4] != GGUF_MAGIC:
        raise ModelFileError(f"not a GGUF file: {name}")
    return _keys(_Reader(Path(name), data, len(data)))


def _mapped(path: Path, parse):
    """`parse` of a reader over the memory-mapped file (only the pages it reads are read)."""
    try:
        with path.open("rb") as handle:
            size = _file_size(handle)
            if size < 4 or handle.read(4) != GGUF_MAGIC:
                raise ModelFileError(f"not a GGUF file: {path}", "specli loads llama.cpp GGUF models (*.gguf)")
            with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
                return parse(_Reader(path, data, size))
    except OSError as error:
        raise ModelFileError(f"cannot read model file {path}: {error.strerror or error}") from error


def _preamble(reader: _Reader) -> tuple[int, int, int]:
    """(version, tensor count, key count), the version checked."""
    reader.take(4, "the magic")
    version = reader.u32("the version")
    if version not in SUPPORTED_VERSIONS:
        if version & 0xFFFF == 0:
            raise reader.fail(f"version {version:#x} looks byte-swapped (a big-endian file); llama.cpp reads little-endian GGUF")
        raise reader.fail(f"GGUF version {version} (llama.cpp reads versions {SUPPORTED_VERSIONS[0]}-{SUPPORTED_VERSIONS[-1]})")
    return version, reader.u64("the tensor count"), reader.u64("the key count")


def _keys(reader: _Reader) -> dict[str, object]:
    _, _, n_keys = _preamble(reader)
    if n_keys * 13 > reader.size:  # each key takes at least 13 bytes
        raise reader.cut_short(f"it claims {n_keys} keys, more than its {reader.size} bytes can hold")
    return _read_metadata(reader, n_keys)


def _file_size(handle) -> int:
    handle.seek(0, 2)
    size = handle.tell()
    handle.seek(0)
    return size


def _parse(reader: _Reader) -> GGUFHeader:
    version, n_tensors, n_keys = _preamble(reader)
    # Each key takes at least 13 bytes and each tensor info at least 32: counts beyond
    # what the file could hold are corruption, caught before any loop runs on them.
    if n_keys * 13 > reader.size or n_tensors * 32 > reader.size:
        raise reader.cut_short(f"it claims {n_keys} keys and {n_tensors} tensors, more than its {reader.size} bytes can hold")
    metadata = _read_metadata(reader, n_keys)
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    tensors = _read_tensor_infos(reader, n_tensors)
    data_start = _align(reader.pos, alignment)
    _check_data_section(reader, tensors, alignment, data_start)
    _check_vocabulary(reader, metadata)
    _check_model_limits(reader, metadata)
    return GGUFHeader(version, metadata, tensors, alignment, data_start, reader.size)


def _read_metadata(reader: _Reader, n_keys: int) -> dict[str, object]:
    metadata: dict[str, object] = {}
    types: dict[str, tuple[int, int | None]] = {}  # key -> (value type, item type)
    for index in range(n_keys):
        key = _decode(reader.raw_string(f"key #{index}'s name", MAX_KEY_BYTES))
        where = f"key #{index} ({key!r})"
        if key in metadata:
            raise reader.fail(f"{where} appears twice")
        value_type = reader.u32(f"the value type of {where}")
        if value_type not in VALUE_TYPES:
            raise reader.fail(f"{where} has unknown value type {value_type}")
        item_type = None
        if value_type == ARRAY:
            item_type, value = _read_array(reader, where, keep_strings=key == TOKENS_KEY)
        else:
            value = _read_scalar(reader, value_type, where)
        metadata[key] = value
        types[key] = (value_type, item_type)
    _check_known_keys(reader, metadata, types)
    return metadata


def _read_scalar(reader: _Reader, value_type: int, where: str) -> object:
    if value_type == STRING:
        return _decode(reader.raw_string(f"the value of {where}"))
    fmt = _SCALAR_FORMATS[ValueType(value_type)]
    return struct.unpack_from(fmt, reader.data, reader.take(struct.calcsize(fmt), f"the value of {where}"))[0]


def _read_array(reader: _Reader, where: str, *, keep_strings: bool = False) -> tuple[int, ArrayValue]:
    item_type = reader.u32(f"the item type of {where}")
    if item_type not in VALUE_TYPES:
        raise reader.fail(f"{where} is an array of unknown type {item_type}")
    if item_type == ARRAY:
        raise reader.fail(f"{where} is an array of arrays, which llama.cpp does not read")
    count = reader.u64(f"the length of {where}")
    item_size = _value_size(item_type)
    if item_size is None:  # strings: at least their 8-byte length each
        if count * 8 > reader.size - reader.pos:
            raise reader.cut_short(f"{where} claims {count} strings, more than the rest of the file can hold")
        texts = reader.strings(count, where, keep=keep_strings)
        return item_type, ArrayValue(VALUE_TYPES[item_type], count, texts)
    start = reader.take(count * item_size, f"the {count} {VALUE_TYPES[item_type]} values of {where}")
    values = None
    if count <= MAX_KEPT_ITEMS:
        fmt = "<" + _SCALAR_FORMATS[ValueType(item_type)][1] * count
        values = struct.unpack_from(fmt, reader.data, start)
    return item_type, ArrayValue(VALUE_TYPES[item_type], count, values)


def _check_known_keys(reader: _Reader, metadata: dict[str, object], types: dict[str, tuple[int, int | None]]) -> None:
    """Keys llama.cpp trusts without checking: a wrong type there aborts it or reads out of bounds."""
    if "general.alignment" in metadata:
        alignment = metadata["general.alignment"]
        if types["general.alignment"][0] != UINT32:
            raise reader.fail(f"general.alignment has type {VALUE_TYPES[types['general.alignment'][0]]}, not uint32")
        if alignment == 0 or alignment & (alignment - 1):
            raise reader.fail(f"general.alignment is {alignment}, not a power of two")
    for key, item_type in _KNOWN_ARRAYS.items():
        if key in types and types[key] != (ARRAY, item_type):
            value_type, actual_item = types[key]
            actual = f"array of {VALUE_TYPES[actual_item]}" if value_type == ARRAY else VALUE_TYPES[value_type]
            raise reader.fail(f"{key} has type {actual}, not array of {VALUE_TYPES[item_type]}")
    tokens = metadata.get(TOKENS_KEY)
    for key in _PER_TOKEN_KEYS:
        values = metadata.get(key)
        if isinstance(tokens, ArrayValue) and isinstance(values, ArrayValue) and values.count != tokens.count:
            raise reader.fail(f"{key} has {values.count} entries for {tokens.count} tokens")


def _check_vocabulary(reader: _Reader, metadata: dict[str, object]) -> None:
    """Token texts must be unique (llama.cpp asserts it), and a SentencePiece vocabulary
    needs a token for every byte: its tokenizer falls back to them and has no other way out."""
    tokens = metadata.get(TOKENS_KEY)
    if not isinstance(tokens, ArrayValue) or tokens.values is None:
        return
    texts = tokens.values
    ids = {text: token for token, text in enumerate(texts)}
    if len(ids) != len(texts):
        token = next(token for token, text in enumerate(texts) if ids[text] != token)
        raise reader.fail(f"tokens {token} and {ids[texts[token]]} of {TOKENS_KEY} are both {texts[token]!r}")
    if metadata.get("tokenizer.ggml.model") == "llama":
        for byte in range(256):
            if f"<0x{byte:02X}>".encode() not in ids and bytes([byte]) not in ids:
                raise reader.fail(f"its SentencePiece vocabulary has no token for byte 0x{byte:02X}, which tokenizing needs")


def _check_model_limits(reader: _Reader, metadata: dict[str, object]) -> None:
    """The architecture's layer and expert counts, within the bounds llama.cpp asserts."""
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str):
        return  # llama.cpp refuses the file itself, with an error

    def number(name: str, default: int = 0) -> int:
        value = metadata.get(f"{arch}.{name}", default)
        if isinstance(value, ArrayValue):  # per-layer values: the largest one counts
            return max(value.values, default=default) if value.values else default
        return value if isinstance(value, int) and not isinstance(value, bool) else default

    layers = number("block_count", 1)
    if not 1 <= layers <= MAX_LAYERS:
        raise reader.fail(f"{arch}.block_count is {layers} (1 to {MAX_LAYERS} layers allowed)")
    if number("nextn_predict_layers") > layers:
        raise reader.fail(f"{arch}.nextn_predict_layers is more than its {layers} layers")
    experts, used = number("expert_count"), number("expert_used_count")
    groups, groups_used = number("expert_group_count"), number("expert_group_used_count")
    if experts > MAX_EXPERTS:
        raise reader.fail(f"{arch}.expert_count is {experts} (at most {MAX_EXPERTS})")
    if used > experts or (experts > 0 and used == 0):
        raise reader.fail(f"{arch}.expert_used_count is {used} for {experts} experts")
    grouping_ok = (
        groups < experts and (groups <= 1 or (experts % groups == 0 and 0 < groups_used < groups))
        if experts > 0
        else groups == 0
    )
    if not grouping_ok:
        raise reader.fail(f"{arch}: {experts} experts cannot form {groups} expert groups with {groups_used} used")
    scaling = metadata.get(f"{arch}.rope.scaling.type")
    if isinstance(scaling, str) and scaling not in ROPE_SCALING_TYPES:
        raise reader.fail(f"{arch}.rope.scaling.type is {scaling!r} (one of {', '.join(ROPE_SCALING_TYPES)})")


def _read_tensor_infos(reader: _Reader, n_tensors: int) -> list[TensorInfo]:
    tensors: list[TensorInfo] = []
    names: set[str] = set()
    for index in range(n_tensors):
        raw = reader.raw_string(f"tensor #{index}'s name", MAX_KEY_BYTES)
        name = _decode(raw)
        where = f"tensor #{index} ({name!r})"
        if len(raw) > MAX_NAME_BYTES:
            raise reader.fail(f"{where} has a name longer than {MAX_NAME_BYTES} bytes")
        if name in names:
            raise reader.fail(f"{where} appears twice")
        names.add(name)
        n_dims = reader.u32(f"the dimension count of {where}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise reader.fail(f"{where} has {n_dims} dimensions (1 to {MAX_DIMS} allowed)")
        shape = tuple(reader.i64(f"dimension {d} of {where}") for d in range(n_dims))
        if any(d < 0 for d in shape):
            raise reader.fail(f"{where} has a negative dimension {shape}")
        ggml_type = reader.u32(f"the type of {where}")
        offset = reader.u64(f"the data offset of {where}")
        tensors.append(TensorInfo(name, shape, ggml_type, offset, _tensor_size(reader, where, shape, ggml_type)))
    return tensors


def _tensor_size(reader: _Reader, where: str, shape: tuple[int, ...], ggml_type: int) -> int | None:
    if ggml_type in REMOVED_GGML_TYPES:
        raise reader.fail(f"{where} uses ggml type {ggml_type}, which ggml no longer supports")
    if ggml_type not in GGML_TYPES:
        return None  # newer than this table: llama.cpp checks it itself
    type_name, block, block_bytes = GGML_TYPES[ggml_type]
    if shape[0] % block:
        raise reader.fail(f"{where} has a first dimension of {shape[0]}, not a multiple of {type_name}'s block of {block}")
    elements = 1
    for d in shape:
        elements *= d
    return elements // block * block_bytes


def _check_data_section(reader: _Reader, tensors: list[TensorInfo], alignment: int, data_start: int) -> None:
    """Tensors lie in order, each at the aligned end of the one before, and inside the file."""
    expected = 0
    for index, tensor in enumerate(tensors):
        where = f"tensor #{index} ({tensor.name!r})"
        if tensor.size is None:
            if data_start + tensor.offset > reader.size:
                raise _truncated(reader, f"{where} starts at byte {data_start + tensor.offset}")
            return  # a type this table does not know: its size, and so the rest, are unknown
        if tensor.offset != expected:
            raise reader.fail(f"{where} has data offset {tensor.offset}, expected {expected}")
        end = data_start + tensor.offset + tensor.size
        if end > reader.size:
            raise _truncated(reader, f"{where} ends at byte {end}")
        expected = _align(tensor.offset + tensor.size, alignment)


def _truncated(reader: _Reader, what: str) -> ModelFileError:
    return ModelFileError(f"{reader.path} is truncated: {what} but the file has {reader.size} bytes", REDOWNLOAD_HINT)


def _align(offset: int, alignment: int) -> int:
    return (offset + alignment - 1) // alignment * alignment


def _decode(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")  # llama.cpp takes names and values as bytes
