"""The ``npz`` DB type: one uncompressed ``.npz`` archive per node per epoch.

``<node>.<epoch>/blobs.npz`` opens with plain ``np.load`` (``allow_pickle=False``).
It is written by the parallel archive writer shared with ``zarr``
(:mod:`ckptstore.formats._packed`): members' bytes go straight from the arrays to
their precomputed offsets, in parallel; every data piece's CRC-32 and every byte of
zip and npy headers between them is recorded, so a flipped byte anywhere in the
archive is detected. Loads read only the requested members' ranges, in parallel,
straight into place.
ml_dtypes blobs are headed as unsigned integers of their size (the manifest names the
type; see :mod:`ckptstore.records._dtypes`).

Example::

    >>> from ckptstore import CheckpointManager
    >>> manager = CheckpointManager("ckpt", "trainer_0", db_type="npz")
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ckptstore._types import Array
from ckptstore.errors import CorruptCheckpointError
from ckptstore.formats._packed import (
    Member,
    check_ranges,
    manifest_ranges,
    read_archive,
    write_shared,
)
from ckptstore.plugin import DBLocation, DBType, WrittenDB, hookimpl, verify_records
from ckptstore.records import BlobRecord, NodeManifest, encode_dtype, plain_dtype

__all__ = ["NpzDB"]

ARCHIVE = "blobs.npz"


class NpzDB(DBType):
    """One ``blobs.npz`` per node checkpoint, readable by ``np.load`` alone.

    Example::

        >>> from ckptstore import CheckpointManager, LocalSession
        >>> session = LocalSession()
        >>> session.workspace("trainer_0")["trainer_0/total"] = np.array([100])
        >>> manager = CheckpointManager("ckpt", "trainer_0", "npz")
        >>> _ = session.run(manager.init(["trainer_0"]))
        >>> _ = session.run(manager.save(4))
        >>> from ckptstore.protocol import open_node
        >>> files = open_node(manager.location.storage, "trainer_0", 4).data_key  # its attempt
        >>> np.load(f"ckpt/{files}/blobs.npz", allow_pickle=False)["trainer_0/total"]
        array([100])
    """

    name = "npz"
    supports_incremental = True

    def write(self, db: DBLocation, blobs: Mapping[str, Array]) -> WrittenDB:
        headers: dict[tuple[str, type, tuple[int, ...]], bytes] = {}

        def members_of(share: Sequence[str]) -> list[Member]:
            members = []
            for name in share:
                array = blobs[name]
                # blobs of one dtype and shape share a header (numpy's writer is slow)
                kind = (array.dtype.str, array.dtype.type, array.shape)
                header = headers.get(kind)
                if header is None:
                    header = headers[kind] = _npy_header(array)
                members.append(Member(f"{name}.npy", header, name, array))
            return members

        written = write_shared(db, ARCHIVE, blobs, members_of)
        records = {
            name: written.blobs.get(name)
            or BlobRecord(name, encode_dtype(name, array.dtype), array.shape, ())
            for name, array in blobs.items()
        }
        return WrittenDB(records, written.files)

    def read(self, db: DBLocation, records: Sequence[BlobRecord]) -> dict[str, Array]:
        check_ranges(db, ARCHIVE, ((r.name, c) for r in records for c in r.chunks))
        return read_archive(db, records)

    def verify(self, db: DBLocation, manifest: NodeManifest) -> list[CorruptCheckpointError]:
        try:
            check_ranges(db, ARCHIVE, manifest_ranges(manifest))
        except CorruptCheckpointError as error:
            return [error]
        return verify_records(db, manifest)


def _npy_header(array: np.ndarray[Any, Any]) -> bytes:
    header = io.BytesIO()
    fields = {
        "descr": np.lib.format.dtype_to_descr(plain_dtype(array.dtype)),
        "fortran_order": False,
        "shape": array.shape,
    }
    np.lib.format.write_array_header_1_0(header, fields)
    return header.getvalue()


@hookimpl
def ckptstore_db_types() -> list[type[DBType]]:
    return [NpzDB]
