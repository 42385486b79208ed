"""A Hub GGUF's header, without downloading the file: one HTTP range request for its start.

A GGUF's keys come first (the tokenizer among them), before the tensor infos and the weights,
so the vocabulary of a multi-gigabyte file is in its first few megabytes. `fetch_metadata` asks
for the first MOST_BYTES and reads the answer as it arrives: once it holds FIRST_BYTES it tries
to read the keys, and again each time a tenth more has come, and it closes the connection as
soon as they are read. So it reads little more than the header, even from a server that ignores
`Range` and sends the whole file.
"""

from __future__ import annotations

from dataclasses import dataclass

from huggingface_hub import HfApi, get_session, hf_hub_url
from huggingface_hub.utils import build_hf_headers

from specli.errors import HubError, ModelFileError
from specli.llama.gguf_header import HeaderCutShort, metadata_from_bytes
from specli.models.hub.download import hub_endpoint
from specli.models.hub.repo import list_repo

FIRST_BYTES = 1 << 20
MOST_BYTES = 16 << 20
CHUNK = 1 << 16


@dataclass(frozen=True)
class RemoteHeader:
    repo: str
    filename: str
    size: int | None  # the file's bytes, from the repo's listing
    metadata: dict[str, object]
    fetched: int  # bytes read over the network, every request together


def search_gguf_repos(query: str, limit: int) -> list[str]:
    """GGUF model repos whose name holds `query`, as the Hub's search ranks them."""
    try:
        return [model.id for model in HfApi(endpoint=hub_endpoint()).list_models(search=query, filter="gguf",
                                                                                  limit=limit)]
    except Exception as error:  # noqa: BLE001 - the Hub unreachable, a refusal: one line
        raise HubError(f"searching the Hub for {query!r} failed: {error}") from None


def gguf_files(repo: str) -> dict[str, int | None]:
    """The repo's GGUF models (part 1 of a split one) and their sizes."""
    listing = list_repo(repo, None, hub_endpoint())
    return {name: listing.files[name].size for name in listing.models}


def reference_header(text: str) -> RemoteHeader | None:
    """The header of the file a Hub reference (`owner/repo:QUANT`, `owner/repo/file.gguf`)
    names, read remotely; None where `text` is not a Hub reference."""
    from specli.models.hub.refs import parse_reference
    from specli.models.hub.repo import choose_model

    reference = parse_reference(text)
    if reference is None:
        return None
    listing = list_repo(reference.repo, None, hub_endpoint())
    name = reference.file or choose_model(reference.repo, listing.models, reference.quant)
    size = listing.files[name].size if name in listing.files else None
    return fetch_metadata(reference.repo, name, size)


def fetch_metadata(repo: str, filename: str, size: int | None = None) -> RemoteHeader:
    """The file's header keys, read from its first bytes (see the module doc)."""
    url = hf_hub_url(repo, filename, endpoint=hub_endpoint())
    headers = {**build_hf_headers(), "Range": f"bytes=0-{MOST_BYTES - 1}"}
    data = bytearray()
    attempt = FIRST_BYTES
    try:
        with get_session().stream("GET", url, headers=headers, follow_redirects=True, timeout=30) as response:
            if response.status_code not in (200, 206):
                raise HubError(f"{repo}/{filename}: HTTP {response.status_code}")
            chunks = response.iter_bytes(CHUNK)
            while True:
                chunk = next(chunks, b"")
                data += chunk[: MOST_BYTES - len(data)]
                ended = not chunk or len(data) >= MOST_BYTES
                if len(data) >= attempt or ended:
                    try:
                        metadata = metadata_from_bytes(bytes(data), f"{repo}/{filename}")
                        return RemoteHeader(repo, filename, size, metadata, len(data))  # the rest is never read
                    except HeaderCutShort:
                        if ended:
                            raise ModelFileError(f"{repo}/{filename}: its header is not within its first "
                                                 f"{len(data)} bytes") from None
                        attempt = len(data) + len(data) // 10
    except (HubError, ModelFileError):
        raise
    except Exception as error:  # noqa: BLE001 - a network failure: one line
        raise HubError(f"reading the header of {repo}/{filename} failed: {error}") from None
