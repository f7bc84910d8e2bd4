"""How a DCP epoch's tensors were sharded, from its metadata document, without torch.

An epoch saved by ``ckptstore.torch.dcp.Writer`` has a node ``dcp`` whose blob
``metadata`` is a JSON document (``ckptstore.dcp-metadata``) naming each tensor's dtype,
global shape and saved chunks (offsets and sizes), and the rank node holding each chunk.
:func:`describe_dcp` reads and checks that document (its size bounded, its CRC and every
field checked as untrusted input) for ``ckptstore inspect``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypedDict

from ckptstore import protocol
from ckptstore.errors import CorruptCheckpointError
from ckptstore.io import IOSettings, ParallelIO
from ckptstore.plugin import DBType, PathType, get_registry
from ckptstore.records import NodeManifest, decode_document, encode_document

__all__ = [
    "MAX_METADATA_BYTES",
    "METADATA_BLOB",
    "METADATA_KIND",
    "METADATA_NODE",
    "DcpChunk",
    "DcpTensor",
    "describe_dcp",
    "metadata_bytes",
    "rebind_nodes",
]

METADATA_NODE = "dcp"
"""The node holding DCP's global metadata (and whose writer lease a save holds)."""
METADATA_BLOB = "metadata"
"""The blob of :data:`METADATA_NODE` holding the metadata document."""
METADATA_KIND = "ckptstore.dcp-metadata"
"""The kind of that JSON control document."""
MAX_METADATA_BYTES = 64 << 20
"""The largest metadata document a reader accepts."""


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


def metadata_bytes(
    storage: PathType, manifest: NodeManifest, db_type: DBType, engine: ParallelIO, *, url: str
) -> bytes:
    """The metadata document of the ``dcp`` node ``manifest``, its size checked before
    it is read and its bytes against their CRC (:func:`~ckptstore.protocol.read_blobs`)."""
    record = manifest.blobs.get(METADATA_BLOB)
    if record is None or record.dtype != "|u1" or record.nbytes > MAX_METADATA_BYTES:
        raise CorruptCheckpointError(
            "it holds no DCP metadata document of a sane size", url=url, blob=METADATA_BLOB
        )
    raw = protocol.read_blobs(storage, manifest, [METADATA_BLOB], db_type, engine)
    return raw[METADATA_BLOB].tobytes()


def describe_dcp(storage: PathType, epoch: int) -> list[DcpTensor] | None:
    """Each tensor of the DCP epoch ``epoch`` (``None`` if the epoch has no ``dcp``
    node): key, dtype, global shape, and its saved chunks with the rank node of each.
    Raises :class:`~ckptstore.errors.CorruptCheckpointError` for a damaged document."""
    record = protocol.require_commit(storage, epoch)
    if METADATA_NODE not in record.nodes:
        return None
    manifest = protocol.open_node(storage, METADATA_NODE, epoch)
    url = storage.display_url
    db_type = get_registry().db_type(manifest.db_type)
    raw = metadata_bytes(storage, manifest, db_type, ParallelIO(IOSettings()), url=url)
    document = decode_document(raw, METADATA_KIND, url=url, key=METADATA_BLOB)
    corrupt = CorruptCheckpointError(
        "the DCP metadata document's tensors or items are malformed", url=url, node=METADATA_NODE
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


def rebind_nodes(raw: bytes, manifests: Mapping[str, int], *, url: str) -> bytes:
    """The metadata document ``raw`` naming ``manifests`` (node: manifest CRC-32C) as
    its rank nodes' manifests, for a copy whose rank nodes were written again
    (``ckptstore cp --materialize``, ``convert``): a reader checks each rank node's
    committed manifest against the one the metadata names. Raises
    :class:`~ckptstore.errors.CorruptCheckpointError` for a damaged document, or one
    naming a node not in ``manifests``."""
    document = decode_document(raw, METADATA_KIND, url=url, key=METADATA_BLOB)
    nodes = document.get("nodes")
    if not isinstance(nodes, dict) or not set(nodes) <= set(manifests):
        raise CorruptCheckpointError(
            "the DCP metadata document names rank nodes the epoch does not hold",
            url=url,
            node=METADATA_NODE,
        )
    body = {k: v for k, v in document.items() if k not in ("crc32c", "kind", "version")}
    body["nodes"] = {node: manifests[node] for node in nodes}
    return encode_document(METADATA_KIND, body)
