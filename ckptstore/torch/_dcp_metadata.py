"""DCP's global ``Metadata`` as a ckptstore control document: JSON, never pickle.

``torch.distributed.checkpoint`` pickles its ``Metadata`` into ``.metadata``; ckptstore
stores the same facts as one self-checking JSON document (:func:`encode_metadata`) and
rebuilds the ``Metadata`` from it (:func:`decode_metadata`), validating every field as
untrusted input: a forged document is a :class:`~ckptstore.errors.CorruptCheckpointError`,
never an object built from it.

What is kept: each tensor's dtype, ``requires_grad``, global size and saved chunks
(offsets and sizes); the names of the byte (non-tensor) entries; the default planner's
``planner_data`` (how flattened keys map back to the nested state dict); and where each
item was stored (its rank's node and blob, :class:`StoredItem`), with every node's
manifest CRC-32C, so the metadata names the exact rank checkpoints it goes with.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)

from ckptstore.errors import CorruptCheckpointError, UnsupportedBlobError
from ckptstore.protocol import NodeCommit
from ckptstore.records import decode_document, encode_document, validate_blob_name
from ckptstore.records import validate_node_name as _validate_node_name
from ckptstore.tools import METADATA_KIND
from ckptstore.torch._adapter import _DTYPES

__all__ = [
    "METADATA_KIND",
    "DecodedMetadata",
    "StoredItem",
    "decode_metadata",
    "encode_metadata",
    "item_key",
]

MAX_DIMS = 64
_MEMORY_FORMATS = {
    "contiguous": torch.contiguous_format,
    "channels_last": torch.channels_last,
    "preserve": torch.preserve_format,
}

ItemKey = tuple[str, tuple[int, ...] | None]
"""An item's identity in the checkpoint: its flattened key, and its chunk's offsets
(``None`` for a byte entry); what ``MetadataIndex`` compares."""


def item_key(index: MetadataIndex) -> ItemKey:
    return index.fqn, None if index.offset is None else tuple(index.offset)


@dataclass(frozen=True)
class StoredItem:
    """Where one written item lives (a ``WriteResult``'s ``storage_data``): the blob
    ``blob`` of node ``node``, written by the save whose node commit is ``commit``."""

    node: str
    blob: str
    commit: NodeCommit


@dataclass(frozen=True)
class DecodedMetadata:
    """A stored metadata document, checked: DCP's ``Metadata``, where each item lives
    (node, blob), and each node's manifest CRC-32C."""

    metadata: Metadata
    items: Mapping[ItemKey, tuple[str, str]]
    nodes: Mapping[str, int]


def encode_metadata(metadata: Metadata, stored: Sequence[StoredItemAt]) -> bytes:
    """The document holding ``metadata`` and where each item of ``stored`` lives.

    Raises :class:`~ckptstore.errors.UnsupportedBlobError` for what has no faithful
    JSON form: a ``planner_data`` that is not the default planner's key mapping (plain
    strings and integers), tensors that are not strided, an unknown memory format.
    """
    tensors: dict[str, object] = {}
    byte_entries: list[str] = []
    for fqn, entry in sorted(metadata.state_dict_metadata.items()):
        if isinstance(entry, BytesStorageMetadata):
            byte_entries.append(fqn)
            continue
        properties = entry.properties
        if properties.layout != torch.strided:
            raise UnsupportedBlobError(fqn, f"{properties.layout} tensors are not supported")
        formats = {value: name for name, value in _MEMORY_FORMATS.items()}
        if properties.memory_format not in formats:
            raise UnsupportedBlobError(fqn, f"memory format {properties.memory_format}")
        tensors[fqn] = {
            "dtype": str(properties.dtype).removeprefix("torch."),
            "requires_grad": bool(properties.requires_grad),
            "memory_format": formats[properties.memory_format],
            "size": list(entry.size),
            "chunks": [[list(chunk.offsets), list(chunk.sizes)] for chunk in entry.chunks],
        }
    nodes: dict[str, int] = {}
    items: list[list[object]] = []
    for index, item in stored:
        nodes[item.node] = item.commit.manifest_crc32c
        offset = None if index.offset is None else list(index.offset)
        items.append([index.fqn, offset, item.node, item.blob])
    body = {
        "dcp_version": metadata.version,
        "tensors": tensors,
        "bytes": byte_entries,
        "planner_data": _encode_planner_data(metadata.planner_data),
        "items": items,
        "nodes": nodes,
    }
    return encode_document(METADATA_KIND, body)


StoredItemAt = tuple[MetadataIndex, StoredItem]


def _encode_planner_data(data: object) -> object:
    """The default planner's ``{flattened key: path}`` (paths of ``str``/``int``), or
    ``None``; anything else has no faithful JSON form here."""
    if data is None:
        return None
    if isinstance(data, Mapping) and all(
        isinstance(key, str)
        and isinstance(path, tuple | list)
        and all(_plain_step(step) for step in path)
        for key, path in data.items()
    ):
        return {key: list(path) for key, path in data.items()}
    raise UnsupportedBlobError(
        "planner_data",
        f"the save planner's planner_data ({type(data).__name__}) is not the default "
        "planner's mapping of keys to paths of str and int; ckptstore stores DCP metadata "
        "as JSON and never pickles it: use DefaultSavePlanner or plain-data planner_data",
    )


def _plain_step(step: object) -> bool:
    return isinstance(step, str) or (isinstance(step, int) and not isinstance(step, bool))


def decode_metadata(data: bytes, *, url: str, key: str) -> DecodedMetadata:
    """The document :func:`encode_metadata` wrote, every field checked; anything else
    raises :class:`~ckptstore.errors.CorruptCheckpointError`."""
    document = decode_document(data, METADATA_KIND, url=url, key=key)
    try:
        return _decode(document)
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as error:
        # InvalidNameError is a ValueError; stored text is untrusted: name the type only
        detail = error.args[0] if isinstance(error, _BadFieldError) else type(error).__name__
        raise CorruptCheckpointError(
            f"the DCP metadata document is malformed: {detail}", url=url, file=key
        ) from None


class _BadFieldError(ValueError):
    """A field that fails its check; the message is ours, not the stored text."""


def _decode(document: Mapping[str, object]) -> DecodedMetadata:
    state: dict[str, TensorStorageMetadata | BytesStorageMetadata] = {}
    for fqn, raw in _mapping(document["tensors"], "tensors").items():
        state[fqn] = _tensor(fqn, _mapping(raw, "a tensor entry"))
    for key in _list(document["bytes"], "bytes"):
        if not isinstance(key, str) or key in state:
            raise _BadFieldError("a byte entry's key is not a new string")
        state[key] = BytesStorageMetadata()
    nodes: dict[str, int] = {}
    for node, crc in _mapping(document["nodes"], "nodes").items():
        nodes[_validate_node_name(node)] = _int(crc, 1 << 32)
    items: dict[ItemKey, tuple[str, str]] = {}
    for raw_item in _list(document["items"], "items"):
        name, offset, holder, blob = _list(raw_item, "an item")
        if not isinstance(name, str) or name not in state or holder not in nodes:
            raise _BadFieldError("an item names an unknown entry or node")
        offsets = None if offset is None else tuple(_ints(offset, "an item's offsets"))
        if (offsets is None) != isinstance(state[name], BytesStorageMetadata):
            raise _BadFieldError("an item's offsets do not match its entry's kind")
        items[(name, offsets)] = (str(holder), validate_blob_name(blob, new=False))
    for fqn, entry in state.items():
        wanted = (
            [(fqn, None)]
            if isinstance(entry, BytesStorageMetadata)
            else [(fqn, tuple(chunk.offsets)) for chunk in entry.chunks]
        )
        if any(key not in items for key in wanted):
            raise _BadFieldError(f"an item of {fqn!r} has no stored location")
    version = document.get("dcp_version")
    metadata = Metadata(
        state_dict_metadata=state,
        planner_data=_planner_data(document.get("planner_data")),
        storage_data=None,
        version=version if isinstance(version, str) else None,
    )
    return DecodedMetadata(metadata, items, nodes)


def _tensor(fqn: str, raw: Mapping[str, object]) -> TensorStorageMetadata:
    dtype = _DTYPES.get(str(raw["dtype"]))
    memory_format = _MEMORY_FORMATS.get(str(raw["memory_format"]))
    if dtype is None or memory_format is None or not isinstance(raw["requires_grad"], bool):
        raise _BadFieldError(f"tensor {fqn!r} has an unknown dtype or memory format")
    size = _ints(raw["size"], "a tensor size")
    chunks = []
    for chunk in _list(raw["chunks"], "chunks"):
        offsets, sizes = (_ints(part, "a chunk") for part in _list(chunk, "a chunk"))
        if len(offsets) != len(size) or len(sizes) != len(size):
            raise _BadFieldError(f"a chunk of {fqn!r} has another rank than the tensor")
        if any(o + s > n for o, s, n in zip(offsets, sizes, size, strict=True)):
            raise _BadFieldError(f"a chunk of {fqn!r} lies outside the tensor")
        chunks.append(ChunkStorageMetadata(torch.Size(offsets), torch.Size(sizes)))
    properties = TensorProperties(
        dtype=dtype, requires_grad=raw["requires_grad"], memory_format=memory_format
    )
    return TensorStorageMetadata(properties, torch.Size(size), chunks)


def _planner_data(raw: object) -> dict[str, tuple[str | int, ...]] | None:
    if raw is None:
        return None
    mapping: dict[str, tuple[str | int, ...]] = {}
    for key, path in _mapping(raw, "planner_data").items():
        steps = _list(path, "a planner_data path")
        if not all(_plain_step(step) for step in steps):
            raise _BadFieldError("a planner_data path holds something other than str and int")
        mapping[key] = tuple(steps)  # type: ignore[arg-type]  # checked just above
    return mapping


def _mapping(value: object, what: str) -> dict[str, object]:
    if not isinstance(value, dict):
        raise _BadFieldError(f"{what} is not a JSON object")
    return value


def _list(value: object, what: str) -> list[object]:
    if not isinstance(value, list):
        raise _BadFieldError(f"{what} is not a JSON list")
    return value


def _int(value: object, end: int = 1 << 62) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < end:
        raise _BadFieldError("a size, offset or checksum is not an integer in range")
    return value


def _ints(value: object, what: str) -> list[int]:
    values = [_int(item) for item in _list(value, what)]
    if len(values) > MAX_DIMS or math.prod(values) >= 1 << 62:
        raise _BadFieldError(f"{what} has too many dimensions or elements")
    return values
