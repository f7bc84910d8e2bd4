"""How a DCP epoch's tensors were sharded, from its metadata document, without torch.

An epoch saved by ``ckptstore.torch.dcp.Writer`` has a node ``dcp`` whose blob
``metadata`` is a JSON document (``ckptstore.dcp-metadata``) naming each tensor's dtype,
global shape and saved chunks (offsets and sizes), and the rank node holding each chunk.
:func:`describe_dcp` reads and checks that document (its size bounded, its CRC and every
field checked as untrusted input) for ``ckptstore inspect``.
"""

from __future__ import annotations

from typing import TypedDict

from ckptstore import protocol
from ckptstore.errors import CorruptCheckpointError
from ckptstore.io._engine import ParallelIO
from ckptstore.io._settings import IOSettings
from ckptstore.plugin._path_type import PathType
from ckptstore.plugin._registry import get_registry
from ckptstore.records import decode_document

__all__ = ["DCP_NODE", "DcpChunk", "DcpTensor", "describe_dcp"]

DCP_NODE = "dcp"
METADATA_BLOB = "metadata"
METADATA_KIND = "ckptstore.dcp-metadata"
MAX_METADATA_BYTES = 64 << 20


class DcpChunk(TypedDict):
    offsets: list[int]
    sizes: list[int]
    node: str


class DcpTensor(TypedDict):
    key: str
    dtype: str
    shape: list[int]
    chunks: list[DcpChunk]


def _ints(value: object, dims: int | None, corrupt: CorruptCheckpointError) -> list[int]:
    if not isinstance(value, list) or (dims is not None and len(value) != dims):
        raise corrupt
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in value):
        raise corrupt
    return list(value)


def describe_dcp(storage: PathType, epoch: int) -> list[DcpTensor] | None:
    """Each tensor of the DCP epoch ``epoch`` (``None`` if the epoch has no ``dcp``
    node): key, dtype, global shape, and its saved chunks with the rank node of each.
    Raises :class:`~ckptstore.errors.CorruptCheckpointError` for a damaged document."""
    record = protocol.require_commit(storage, epoch)
    if DCP_NODE not in record.nodes:
        return None
    manifest = protocol.open_node(storage, DCP_NODE, epoch)
    url = storage.display_url
    blob = manifest.blobs.get(METADATA_BLOB)
    if blob is None or blob.dtype != "|u1" or blob.nbytes > MAX_METADATA_BYTES:
        raise CorruptCheckpointError(
            "it holds no DCP metadata document of a sane size", url=url, node=DCP_NODE
        )
    db_type = get_registry().db_type(manifest.db_type)
    raw = protocol.read_blobs(storage, manifest, [METADATA_BLOB], db_type, ParallelIO(IOSettings()))
    document = decode_document(
        raw[METADATA_BLOB].tobytes(), METADATA_KIND, url=url, key=f"{DCP_NODE}.{epoch}"
    )
    corrupt = CorruptCheckpointError(
        "the DCP metadata document's tensors or items are malformed", url=url, node=DCP_NODE
    )
    tensors, items = document.get("tensors"), document.get("items")
    if not isinstance(tensors, dict) or not isinstance(items, list):
        raise corrupt
    where: dict[tuple[str, tuple[int, ...]], str] = {}
    for item in items:
        if not isinstance(item, list) or len(item) != 4 or not isinstance(item[2], str):
            raise corrupt
        if isinstance(item[0], str) and isinstance(item[1], list):
            where[(item[0], tuple(_ints(item[1], None, corrupt)))] = item[2]
    described: list[DcpTensor] = []
    for key, entry in sorted(tensors.items()):
        if not isinstance(entry, dict) or not isinstance(entry.get("dtype"), str):
            raise corrupt
        shape = _ints(entry.get("size"), None, corrupt)
        chunks = entry.get("chunks")
        if not isinstance(chunks, list):
            raise corrupt
        listed: list[DcpChunk] = []
        for chunk in chunks:
            if not isinstance(chunk, list) or len(chunk) != 2:
                raise corrupt
            offsets = _ints(chunk[0], len(shape), corrupt)
            sizes = _ints(chunk[1], len(shape), corrupt)
            node = where.get((key, tuple(offsets)), "?")
            listed.append({"offsets": offsets, "sizes": sizes, "node": node})
        described.append({"key": key, "dtype": entry["dtype"], "shape": shape, "chunks": listed})
    return described
