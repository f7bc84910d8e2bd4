"""The keys of a root's control directory (``_ckptstore/``) that resume, retention and
chunk collections read: every one but those of the chunk store, which holds an object
per chunk that incremental saves kept (thousands), none of which they need."""

from __future__ import annotations

from ckptstore.io import CHUNK_STORE_DIR
from ckptstore.plugin import PathType
from ckptstore.protocol._location import CheckpointLocation, storage_of
from ckptstore.records import CONTROL_DIR

__all__ = ["control_keys"]


def control_keys(where: CheckpointLocation | PathType, prefix: str = "") -> list[str]:
    """The keys of the control directory (of the run at ``prefix``) but those of its
    chunk store: commit records, leases, tombstones, intents, markers
    (:meth:`PathType.list_keys_except` leaves the chunk store unlisted).

    Example::

        >>> from ckptstore.builtin import LocalPath
        >>> storage = LocalPath("control")
        >>> storage.write_bytes("_ckptstore/chunks/" + "0" * 32, b"x")  # a chunk
        >>> storage.write_bytes("_ckptstore/epoch-1/t.commit.json", b"{}")
        >>> control_keys(storage)
        ['_ckptstore/epoch-1/t.commit.json']
    """
    storage = storage_of(where)
    inside = f"{prefix}/" if prefix else ""
    return storage.list_keys_except(inside + CONTROL_DIR, inside + CHUNK_STORE_DIR)
