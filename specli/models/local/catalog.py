"""What each local GGUF is, from its header alone, and which of them can draft for which.

A summary holds the architecture, the file's size, its quantisation (`general.file_type`), and
its vocabulary's key: the tokenizer type, the token count, BOS/EOS and whether they are added,
and a hash of the token texts from id 5 up to each multiple of CHECKPOINT tokens (and up to the
last token). Two vocabularies pass llama.cpp's rule (vocab.py) where the types, BOS/EOS settings
agree, the counts are at most 128 apart, and the texts agree from id 5 on: here, the hashes at
the last checkpoint both reach. The tokens past that checkpoint (fewer than CHECKPOINT) are
compared when the pair loads, by the rule itself.

Summaries are kept in the cache folder by path, size and modification time, so a second listing
reads no header at all.
"""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import gguf

from specli.errors import ModelFileError
from specli.llama.gguf_header import ArrayValue, read_metadata
from specli.llama.vocab import VOCAB_CHECK_START_TOKEN_ID, VOCAB_MAX_SIZE_DIFFERENCE
from specli.models.local.stores import LocalFile

CHECKPOINT = 4096
SUMMARY_VERSION = 3
FILE_TYPES = {int(kind): kind.name.replace("MOSTLY_", "") for kind in gguf.LlamaFileType}


@dataclass(frozen=True)
class Vocabulary:
    model: str  # tokenizer.ggml.model: "llama" (SentencePiece), "gpt2" (BPE)...
    size: int
    bos: int | None
    eos: int | None
    add_bos: bool
    add_eos: bool
    hashes: dict[int, str]  # texts[5:n] hashed, for n at each multiple of CHECKPOINT and at the end

    def common_hash(self, other: Vocabulary) -> tuple[str, str] | None:
        """The two hashes at the last point both vocabularies reach."""
        both = set(self.hashes) & set(other.hashes)
        if not both:
            return None
        point = max(both)
        return self.hashes[point], other.hashes[point]


@dataclass(frozen=True)
class Summary:
    store: str
    name: str
    path: str
    size: int  # bytes
    architecture: str
    quantisation: str
    vocabulary: Vocabulary | None  # None: the file has no tokenizer
    basename: str = "-"  # general.basename (else general.name): what a Hub search for its family asks for
    projector: str = ""  # the image projector beside it (an mmproj GGUF in its folder), where there is one

    @property
    def family(self) -> str:
        """A short name for the vocabulary: its tokenizer type, size and first hash."""
        if self.vocabulary is None:
            return "-"
        vocab = self.vocabulary
        first = vocab.hashes.get(min(vocab.hashes), "")[:6] if vocab.hashes else ""
        return f"{vocab.model}-{vocab.size // 1000}k-{first}"


def summarise(file: LocalFile) -> Summary:
    """The file's summary from its header's keys (ModelFileError for a file that is not GGUF or
    whose header is cut short; the whole file is checked when it loads)."""
    return summary_from_metadata(file.store, file.name, str(file.path), file.path.stat().st_size,
                                 read_metadata(file.path))


def summary_from_metadata(store: str, name: str, path: str, size: int, meta: dict) -> Summary:
    file_type = meta.get("general.file_type")
    quant = FILE_TYPES.get(file_type, str(file_type)) if isinstance(file_type, int) else "-"
    basename = meta.get("general.basename") or meta.get("general.name") or "-"
    return Summary(store, name, path, size, str(meta.get("general.architecture", "-")), quant, _vocabulary(meta),
                   str(basename))


def _vocabulary(meta: dict) -> Vocabulary | None:
    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, ArrayValue) or tokens.values is None:
        return None
    texts = tokens.values
    hashes: dict[int, str] = {}
    digest = hashlib.blake2b(digest_size=16)
    start = VOCAB_CHECK_START_TOKEN_ID
    for point in [*range(CHECKPOINT, len(texts), CHECKPOINT), len(texts)]:
        # Token texts are UTF-8, where no byte is 0xFF: joined by it, they hash unambiguously.
        digest.update(b"\xff".join(texts[start:point]) + b"\xff")
        start = point
        hashes[point] = digest.hexdigest()
    return Vocabulary(str(meta.get("tokenizer.ggml.model", "-")), len(texts), _int(meta.get("tokenizer.ggml.bos_token_id")),
                      _int(meta.get("tokenizer.ggml.eos_token_id")), bool(meta.get("tokenizer.ggml.add_bos_token", False)),
                      bool(meta.get("tokenizer.ggml.add_eos_token", False)), hashes)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def drafts_directly(target: Vocabulary, draft: Vocabulary) -> bool:
    """llama.cpp's rule (see the module doc for the last tokens): token ids mean the same."""
    if target.model != draft.model or abs(target.size - draft.size) > VOCAB_MAX_SIZE_DIFFERENCE:
        return False
    if target.add_bos != draft.add_bos or (target.add_bos and target.bos != draft.bos):
        return False
    if target.add_eos != draft.add_eos or (target.add_eos and target.eos != draft.eos):
        return False
    return same_texts(target, draft)


def same_texts(target: Vocabulary, draft: Vocabulary) -> bool:
    hashes = target.common_hash(draft)
    return hashes is not None and hashes[0] == hashes[1] and abs(target.size - draft.size) <= VOCAB_MAX_SIZE_DIFFERENCE


@dataclass(frozen=True)
class LocalPair:
    target: Summary
    draft: Summary
    through_text: bool  # the rule fails (BOS/EOS settings), though the token texts agree


def pairs(summaries: list[Summary]) -> list[LocalPair]:
    """Every (target, smaller draft) of one vocabulary family: direct where llama.cpp's rule
    passes, through text where only the BOS/EOS settings differ. Targets largest first, each
    target's drafts smallest first."""
    found = []
    models = sorted((s for s in summaries if s.vocabulary is not None), key=lambda s: (-s.size, s.name))
    for target in models:
        for draft in sorted(models, key=lambda s: (s.size, s.name)):
            if draft.size >= target.size or draft.path == target.path:
                continue
            assert target.vocabulary is not None and draft.vocabulary is not None
            if target.vocabulary.model != draft.vocabulary.model or not same_texts(target.vocabulary, draft.vocabulary):
                continue
            found.append(LocalPair(target, draft, not drafts_directly(target.vocabulary, draft.vocabulary)))
    return found


class SummaryCache:
    """Summaries by path, size and modification time, in one JSON file; a header that failed
    is kept as its problem."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._entries: dict[str, dict] = {}
        self._dirty = False
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("version") == SUMMARY_VERSION:
                self._entries = data.get("files", {})
        except (OSError, ValueError, AttributeError):
            pass

    @staticmethod
    def key(file: LocalFile) -> str:
        stat = file.path.stat()
        return f"{file.path}|{stat.st_size}|{stat.st_mtime_ns}"

    def get(self, file: LocalFile) -> Summary | None:
        """The kept summary (None where there is none); ModelFileError for a kept problem."""
        cached = self._entries.get(self.key(file))
        if cached is None:
            return None
        if "problem" in cached:
            raise ModelFileError(cached["problem"])
        vocab = cached.get("vocabulary")
        if vocab is not None:
            vocab = Vocabulary(**{**vocab, "hashes": {int(k): v for k, v in vocab["hashes"].items()}})
        return Summary(**{**cached, "store": file.store, "name": file.name, "vocabulary": vocab})

    def put(self, file: LocalFile, found: Summary | str) -> None:
        """A summary, or the problem its header gave."""
        self._entries[self.key(file)] = {"problem": found} if isinstance(found, str) else asdict(found)
        self._dirty = True

    def save(self) -> None:
        """Written whole to a temporary file, then moved into place: never half written."""
        if not self._dirty:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_suffix(f".tmp{os.getpid()}")
        temporary.write_text(json.dumps({"version": SUMMARY_VERSION, "files": self._entries}), encoding="utf-8")
        os.replace(temporary, self.path)


PARALLEL_FROM = 16  # headers to read before the work is spread over the cores


def _summary_or_problem(file: LocalFile) -> Summary | str:
    try:
        return summarise(file)
    except ModelFileError as error:
        return error.message


def catalogue(files: list[LocalFile], cache: SummaryCache | None, problems: list[str]) -> list[Summary]:
    """Each file's summary, in order; a file whose header is bad is one problem line. Headers
    not kept yet are read on every core when there are many."""
    found: dict[int, Summary | str] = {}
    missing: list[int] = []
    for index, file in enumerate(files):
        try:
            kept = cache.get(file) if cache is not None else None
        except ModelFileError as error:
            kept = error.message  # type: ignore[assignment]
        except OSError as error:
            kept = f"cannot read it: {error.strerror or error}"  # type: ignore[assignment]
        if kept is None:
            missing.append(index)
        else:
            found[index] = kept
    workers = min(os.cpu_count() or 1, 8)
    if len(missing) >= PARALLEL_FROM and workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            results = list(pool.map(_summary_or_problem, [files[i] for i in missing], chunksize=8))
    else:
        results = [_summary_or_problem(files[i]) for i in missing]
    for index, result in zip(missing, results):
        found[index] = result
        if cache is not None:
            cache.put(files[index], result)
    summaries = []
    for index, file in enumerate(files):
        result = found[index]
        if isinstance(result, str):
            problems.append(f"{file.store}: {file.name}: {result}")
        else:
            summaries.append(result)
    if cache is not None:
        try:
            cache.save()
        except OSError as error:
            problems.append(f"cannot keep the summaries in {cache.path}: {error.strerror or error}")
    return summaries
