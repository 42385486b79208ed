"""The one owner of llama.cpp's multimodal binding (mtmd: `llama_cpp.mtmd_cpp`).

A projector ("mmproj" GGUF, `general.architecture = clip`) turns an image into embeddings in
the target's input space. `Projector.prompt` splits a prompt's text at its markers into text
and image chunks (mtmd_tokenize); `Images.decode` decodes them into the target's sequence 0:
text through the target's own decode, each image encoded by the projector (timed apart) and
its embeddings decoded by mtmd's helper, which sets the positions (M-RoPE's 2-D ones too) and
the non-causal mask an image needs. The token list the engine gets holds a placeholder at
each position an image takes (specli.decode.media).

Invariants:
- An image is checked (kind, whole file, size) before stb_image reads it: a bad one is one
  line naming it (ImageError), never a crash or an allocation of gigabytes.
- The chunks live as long as the Images that decodes them (`close`, or when collected).
"""

from __future__ import annotations

import ctypes
import hashlib
import struct
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specli.errors import ModelFileError, PromptError, SpecliError, UsageError
from specli.llama.backend import DecodeError, Model, check_gguf_file, init_backend, log_callback
from specli.llama.gguf_header import read_header

try:  # a llama-cpp-python without mtmd_cpp (older than the floor pyproject.toml sets)
    from llama_cpp import mtmd_cpp as _mtmd
except (ImportError, AttributeError, OSError):  # pragma: no cover - depends on the build
    _mtmd = None

MARKER = "<__media__>"  # mtmd's default marker: where an image goes in a prompt's text
MAX_SIDE = 16384  # pixels: a larger image is refused before it is decoded (stb_image reads it whole)
MAX_PIXELS = 64 * 1024 * 1024
_TEXT, _IMAGE = 0, 1  # MTMD_INPUT_CHUNK_TYPE_*
_NO_CALLBACK = ctypes.cast(None, _mtmd.mtmd_helper_post_decode_callback) if _mtmd is not None else None


def placeholder(image_id: str) -> int:
    """The id every position of the image with this id holds in a prompt's tokens: negative,
    never a token (specli.decode.media)."""
    return -1 - (zlib.crc32(image_id.encode()) & 0x3FFFFFFF)


class ImageError(PromptError):
    """An image that is not one, is cut short, too large, or that the model cannot take."""


def available() -> bool:
    """Whether this llama-cpp-python build binds mtmd (doctor says)."""
    return _mtmd is not None


def is_projector(path: Path) -> bool:
    """Whether the GGUF is a projector (clip), not a language model."""
    try:
        return read_header(path).metadata.get("general.architecture") == "clip"
    except SpecliError:  # an unreadable file is no projector
        return False


@dataclass(frozen=True)
class Image:
    """An image's bytes, checked, and its identity (a digest of the bytes)."""

    data: bytes
    name: str  # where it came from, for messages: a path, or "messages[1].content[0]"
    width: int
    height: int

    @property
    def id(self) -> str:
        return hashlib.sha256(self.data).hexdigest()[:32]


def read_image(data: bytes, name: str) -> Image:
    """The image in `data`, its kind and size read from its header; refused in one line where
    it is empty, not an image, cut short or too large."""
    if not data:
        raise ImageError(f"image {name} is empty (0 bytes)")
    size = _png_size(data) or _jpeg_size(data) or _gif_size(data) or _bmp_size(data)
    if size is None:
        raise ImageError(f"{name} is not an image this build reads", "give a PNG, JPEG, GIF or BMP file")
    width, height = size
    if width <= 0 or height <= 0:
        raise ImageError(f"image {name} says it is {width}x{height} pixels")
    if max(width, height) > MAX_SIDE or width * height > MAX_PIXELS:
        raise ImageError(f"image {name} is {width}x{height} pixels, larger than {MAX_SIDE} a side "
                         f"or {MAX_PIXELS // (1024 * 1024)} megapixels", "scale it down first")
    if data[:8] == b"\x89PNG\r\n\x1a\n" and b"IEND" not in data[-16:]:
        raise ImageError(f"image {name} is cut short (a PNG without its end)")
    if data[:2] == b"\xff\xd8" and b"\xff\xd9" not in data[-4096:]:
        raise ImageError(f"image {name} is cut short (a JPEG without its end)")
    return Image(data, name, width, height)


def read_image_file(path: Path) -> Image:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ImageError(f"image not found: {path}") from None
    except IsADirectoryError:
        raise ImageError(f"image {path} is a directory", "give the path of an image file in it") from None
    except OSError as error:
        raise ImageError(f"cannot read image {path}: {error.strerror or error}") from None
    return read_image(data, str(path))


def _png_size(data: bytes) -> tuple[int, int] | None:
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        return None
    if len(data) < 24 or data[12:16] != b"IHDR":
        raise ImageError("a PNG without its header (IHDR)")
    return struct.unpack(">II", data[16:24])


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    if data[:2] != b"\xff\xd8":
        return None
    at = 2
    while at + 9 < len(data):
        if data[at] != 0xFF:
            at += 1
            continue
        marker = data[at + 1]
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7 or marker == 0xFF:
            at += 1 if marker == 0xFF else 2
            continue
        length = struct.unpack(">H", data[at + 2 : at + 4])[0]
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            height, width = struct.unpack(">HH", data[at + 5 : at + 9])
            return width, height
        at += 2 + length
    raise ImageError("a JPEG whose size cannot be read (no frame header)")


def _gif_size(data: bytes) -> tuple[int, int] | None:
    if data[:6] not in (b"GIF87a", b"GIF89a") or len(data) < 10:
        return None
    return struct.unpack("<HH", data[6:10])


def _bmp_size(data: bytes) -> tuple[int, int] | None:
    if data[:2] != b"BM" or len(data) < 26:
        return None
    width, height = struct.unpack("<ii", data[18:26])
    return width, abs(height)


class Projector:
    """A projector loaded for one target: what the images of its prompts become."""

    def __init__(self, path: Path, target: Model, *, threads: int, gpu: bool, verbose: bool = False) -> None:
        if _mtmd is None:
            raise UsageError("this llama-cpp-python build has no mtmd (images need 0.3.36 or later)",
                             "pip install -U llama-cpp-python")
        check_gguf_file(path)
        if not is_projector(path):
            raise ModelFileError(f"{path.name} is not a projector (its architecture is not clip)",
                                 "--mmproj takes the mmproj-*.gguf file that goes with the model")
        init_backend(verbose)
        _mtmd.mtmd_log_set(log_callback(verbose), None)
        _mtmd.mtmd_helper_log_set(log_callback(verbose), None)
        params = _mtmd.mtmd_context_params_default()
        params.use_gpu = gpu
        params.n_threads = threads
        params.print_timings = False
        params.warmup = False
        params.media_marker = MARKER.encode()
        self.path = path
        self.target = target
        self._ctx = _mtmd.mtmd_init_from_file(str(path).encode(), target.model_handle, params)
        if not self._ctx:
            raise ModelFileError(f"llama.cpp could not load the projector {path.name} for {target.path.name}",
                                 "a projector fits one model (its width and its projector type): "
                                 "rerun with --verbose for llama.cpp's reason")
        self.vision = bool(_mtmd.mtmd_support_vision(self._ctx))
        self.audio = bool(_mtmd.mtmd_support_audio(self._ctx))
        self.mrope = bool(_mtmd.mtmd_decode_use_mrope(self._ctx))
        if not self.vision:
            self.close()
            raise ModelFileError(f"the projector {path.name} takes no images (audio only)",
                                 "specli reads images only")

    def prompt(self, text: str, images: list[Image], *, add_special: bool,
               parse_special: bool) -> tuple[list[int], Images]:
        """The prompt's tokens, a placeholder at each image position, and its images. An image
        goes where the text has MARKER; images without one go before the text, in order."""
        missing = len(images) - text.count(MARKER)
        if missing < 0:
            raise ImageError(f"the prompt has {text.count(MARKER)} image markers ({MARKER}) "
                             f"but {len(images)} images")
        text = MARKER * missing + text
        bitmaps: list = []
        chunks = _mtmd.mtmd_input_chunks_init()
        try:
            for image in images:
                bitmaps.append(self._bitmap(image))
            source = _mtmd.mtmd_input_text()
            encoded = text.encode()
            source.text, source.text_len = encoded, len(encoded)
            source.add_special, source.parse_special = add_special, parse_special
            array = (_mtmd.mtmd_bitmap_p_ctypes * max(len(bitmaps), 1))(*bitmaps)
            status = _mtmd.mtmd_tokenize(self._ctx, chunks, ctypes.byref(source), array, len(bitmaps))
            if status != 0:
                raise ImageError(f"mtmd could not split the prompt at its images (status {status})")
            return _read_chunks(self, chunks)
        except BaseException:
            _mtmd.mtmd_input_chunks_free(chunks)
            raise
        finally:
            for bitmap in bitmaps:
                _mtmd.mtmd_bitmap_free(bitmap)

    def _bitmap(self, image: Image):
        buffer = (ctypes.c_uint8 * len(image.data)).from_buffer_copy(image.data)
        bitmap = _mtmd.mtmd_helper_bitmap_init_from_buf(self._ctx, buffer, len(image.data), False)
        if not bitmap:
            raise ImageError(f"image {image.name} could not be decoded (a damaged or unsupported file)")
        _mtmd.mtmd_bitmap_set_id(bitmap, image.id.encode())
        return bitmap

    def close(self) -> None:
        if getattr(self, "_ctx", None):
            _mtmd.mtmd_free(self._ctx)
            self._ctx = None

    def __del__(self) -> None:
        self.close()


def _read_chunks(projector: Projector, chunks) -> tuple[list[int], Images]:
    tokens: list[int] = []
    spans: list[tuple[int, int, object]] = []  # (first position, positions, chunk)
    cells = 0
    for i in range(_mtmd.mtmd_input_chunks_size(chunks)):
        chunk = _mtmd.mtmd_input_chunks_get(chunks, i)
        if _mtmd.mtmd_input_chunk_get_type(chunk) == _TEXT:
            n = ctypes.c_size_t()
            ids = _mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
            tokens += [int(ids[j]) for j in range(n.value)]
            cells += n.value
            continue
        if _mtmd.mtmd_input_chunk_get_type(chunk) != _IMAGE:
            raise ImageError("the prompt has audio, which specli does not read")
        positions = int(_mtmd.mtmd_input_chunk_get_n_pos(chunk))
        image_id = (_mtmd.mtmd_input_chunk_get_id(chunk) or b"").decode()
        spans.append((len(tokens), positions, chunk))
        tokens += [placeholder(image_id)] * positions
        cells += int(_mtmd.mtmd_input_chunk_get_n_tokens(chunk))
    if spans and spans[-1][0] + spans[-1][1] == len(tokens):
        raise ImageError("the prompt ends with an image: put text after it (a question, or the chat "
                         "template's turn) for the model to answer from")
    return tokens, Images(projector, chunks, spans, cells)


class Images:
    """The images of one prompt (specli.decode.media.PromptMedia), decoded with its text."""

    def __init__(self, projector: Projector, chunks, spans: list[tuple[int, int, object]], cells: int) -> None:
        self.projector, self._chunks, self.spans, self.cells = projector, chunks, spans, cells
        self.count = len(spans)
        self.encode_seconds = 0.0

    def start_of(self, position: int) -> int:
        for first, positions, _ in self.spans:
            if first < position < first + positions:
                return first
        return position

    def decode(self, target: Any, prompt: list[int], start: int) -> np.ndarray:
        """(`target`: a Model, decoding its sequence 0, or a slot running alone: its sequence.)"""
        at = start
        row = None
        for first, positions, chunk in self.spans:
            if first + positions <= at:
                continue
            if first > at:
                target.decode(prompt[at:first])
            self._decode_image(target, chunk, first, positions)
            row = None
            at = first + positions
        if at < len(prompt):
            row = target.decode(prompt[at:])[0]
        assert row is not None, "a prompt ends with text (_read_chunks)"
        return row

    def _decode_image(self, target: Any, chunk, first: int, positions: int) -> None:
        ctx = self.projector._ctx
        started = time.perf_counter()
        status = _mtmd.mtmd_encode_chunk(ctx, chunk)
        self.encode_seconds += time.perf_counter() - started
        if status != 0:
            raise ImageError(f"the projector could not encode an image (status {status})")
        embeddings = _mtmd.mtmd_get_output_embd(ctx)
        target.detach_sampler()
        n_past = _mtmd.llama_cpp.llama_pos(0)
        sequence = getattr(target, "sequence", 0)  # a slot's own; a Model decodes sequence 0
        status = _mtmd.mtmd_helper_decode_image_chunk(ctx, target.context_handle, chunk, embeddings, first, sequence,
                                                      target.batch_size, ctypes.byref(n_past), _NO_CALLBACK, None)
        if status != 0:
            target.rewind(first)
            raise DecodeError(status, target.path, "failed to decode an image's embeddings")
        target.took(first, positions)

    def close(self) -> None:
        if self._chunks is not None:
            _mtmd.mtmd_input_chunks_free(self._chunks)
            self._chunks = None

    def __del__(self) -> None:
        self.close()
