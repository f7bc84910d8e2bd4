"""One node's commit record: the value a completed save leaves on storage, encoded and
decoded with every field checked (the record may be forged).

Writing and reading records is the commit protocol's job (:mod:`ckptstore.protocol`);
this is only the value, so that stats and reports can carry it.

Example::

    >>> commit = NodeCommit("trainer_0", 3, "npz", manifest_crc32c=7, nbytes=24,
    ...                     stored_bytes=24, nblobs=1, attempt="0123456789ab")
    >>> commit.data_key
    'trainer_0.3/attempt-0123456789ab'
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ckptstore._types import JSONObject
from ckptstore.errors import CorruptCheckpointError
from ckptstore.records._documents import decode_document, encode_document, json_int
from ckptstore.records._layout import node_data_key, validate_attempt
from ckptstore.records._names import validate_node_name

__all__ = ["NODE_COMMIT_KIND", "NodeCommit", "stored_int"]

NODE_COMMIT_KIND = "ckptstore.node-commit"


@dataclass(frozen=True)
class NodeCommit:
    """One node's completed save, as recorded in the epoch's commit record."""

    node: str
    epoch: int
    db_type: str
    manifest_crc32c: int
    nbytes: int
    stored_bytes: int
    nblobs: int
    duration_ns: int = 0
    lease_generation: int | None = None
    """The writer lease generation its writer held when it committed (the fencing
    token, see :mod:`ckptstore.protocol`); ``None`` without a lease."""
    committed_at: str | None = field(default=None, compare=False)
    """When its record was created; ``None`` until
    :func:`ckptstore.protocol.commit_epoch` created it (a catalog then files the commit
    just written without reading it back)."""
    shared_bytes: int = 0
    """Of ``stored_bytes``, those in the root's chunk store (an incremental save's
    large blobs, shared with other epochs and nodes); the rest is the node's own."""
    attempt: str | None = None
    """The save attempt whose data this commits (``<node>.<epoch>/attempt-<id>/``);
    ``None`` in records of earlier versions, whose data is at ``<node>.<epoch>/``."""

    @property
    def data_key(self) -> str:
        """The key prefix of the committed data (see :func:`node_data_key`)."""
        return node_data_key(self.node, self.epoch, self.attempt)

    def encode(self) -> JSONObject:
        encoded: JSONObject = {
            "db_type": self.db_type,
            "manifest_crc32c": self.manifest_crc32c,
            "nbytes": self.nbytes,
            "stored_bytes": self.stored_bytes,
            "nblobs": self.nblobs,
            "duration_ns": self.duration_ns,
        }
        if self.lease_generation is not None:
            encoded["lease_generation"] = self.lease_generation
        if self.shared_bytes:
            encoded["shared_bytes"] = self.shared_bytes
        if self.attempt is not None:
            encoded["attempt"] = self.attempt
        return encoded

    def encode_record(self, committed_at: str) -> bytes:
        """This node's commit record (``_ckptstore/epoch-<N>/<node>.commit.json``)."""
        return encode_document(
            NODE_COMMIT_KIND,
            {"node": self.node, "epoch": self.epoch, "committed_at": committed_at, **self.encode()},
        )

    @classmethod
    def decode_record(
        cls, data: bytes, *, url: str, key: str, node: str, epoch: int
    ) -> tuple[NodeCommit, str]:
        """A node's commit record and its commit time; it must name ``node`` and
        ``epoch`` (a record copied under another name is corrupt, not trusted); a damaged
        one raises a :class:`CorruptCheckpointError` naming them."""
        try:
            document = decode_document(data, NODE_COMMIT_KIND, url=url, key=key)
        except CorruptCheckpointError as error:
            raise error.located(node=node, epoch=epoch) from None
        try:
            if document["node"] != node or json_int(document, "epoch") != epoch:
                raise ValueError(
                    f"it belongs to {document['node']}.{document['epoch']}, not {node}.{epoch}"
                )
            stamp = str(document["committed_at"])
            return replace(cls.decode(node, epoch, document), committed_at=stamp), stamp
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise CorruptCheckpointError(
                f"commit record is malformed: {error}", url=url, file=key, node=node, epoch=epoch
            ) from None

    @classmethod
    def decode(cls, node: str, epoch: int, raw: object) -> NodeCommit:
        if not isinstance(raw, dict):
            raise ValueError(f"node record {raw!r} is not a JSON object")
        return cls(
            node=validate_node_name(node),
            epoch=epoch,
            db_type=str(raw["db_type"]),
            manifest_crc32c=stored_int(raw["manifest_crc32c"], 1 << 32),
            nbytes=stored_int(raw["nbytes"]),
            stored_bytes=stored_int(raw["stored_bytes"]),
            nblobs=stored_int(raw["nblobs"]),
            duration_ns=stored_int(raw.get("duration_ns", 0)),
            lease_generation=(
                stored_int(raw["lease_generation"]) if "lease_generation" in raw else None
            ),
            shared_bytes=stored_int(raw.get("shared_bytes", 0)),
            attempt=validate_attempt(raw["attempt"]) if "attempt" in raw else None,
        )


def stored_int(value: object, end: int = 1 << 63) -> int:
    """An integer field of a stored document, in ``[0, end)``; ValueError otherwise."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < end:
        raise ValueError("a count or size is not an integer in range")
    return value
