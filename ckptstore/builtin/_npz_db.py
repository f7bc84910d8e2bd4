"""The ``npz`` DB type: one uncompressed ``.npz`` archive per node per epoch.

``<node>.<epoch>/blobs.npz`` opens with plain ``np.load`` (``allow_pickle=False``).
Members are streamed chunk by chunk straight from the arrays (no second copy of the
state in memory); every chunk's CRC-32C and every byte of zip and npy headers between
them is recorded, so a flipped byte anywhere in the archive is detected. Loads read
only the requested members' chunks, in parallel, straight into place.

Example::

    >>> from ckptstore import CheckpointManager
    >>> manager = CheckpointManager("ckpt", "trainer_0", db_type="npz")
"""

from __future__ import annotations

import contextlib
import io
import zipfile
from collections.abc import Iterator, Mapping
from typing import IO, Any

import numpy as np

from ckptstore._types import Array, byte_view
from ckptstore.io._checksum import crc32c_of
from ckptstore.io._chunking import array_chunks, chunk_data, grid_chunk_shape
from ckptstore.plugin._db_type import DBLocation, DBType, WrittenDB
from ckptstore.plugin._markers import hookimpl
from ckptstore.records._manifest import BlobRecord, ChunkRecord

__all__ = ["NpzDB"]

ARCHIVE = "blobs.npz"
_EPOCH_1980 = (1980, 1, 1, 0, 0, 0)


class NpzDB(DBType):
    """One ``blobs.npz`` per node checkpoint, readable by ``np.load`` alone.

    Example::

        >>> from ckptstore import CheckpointManager, LocalSession
        >>> session = LocalSession()
        >>> session.workspace("trainer_0")["trainer_0/total"] = np.array([100])
        >>> manager = CheckpointManager("ckpt", "trainer_0", "npz")
        >>> _ = session.run(manager.init(["trainer_0"]))
        >>> _ = session.run(manager.save(4))
        >>> np.load("ckpt/trainer_0.4/blobs.npz", allow_pickle=False)["trainer_0/total"]
        array([100])
    """

    name = "npz"

    def write(self, db: DBLocation, blobs: Mapping[str, Array]) -> WrittenDB:
        target = db.io.settings.chunk_bytes
        records: dict[str, BlobRecord] = {}
        with db.open_write(ARCHIVE) as raw:
            stream = _GapRecorder(raw)
            with zipfile.ZipFile(stream, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
                for name, array in blobs.items():
                    info = zipfile.ZipInfo(f"{name}.npy", date_time=_EPOCH_1980)
                    with archive.open(info, "w", force_zip64=True) as member:
                        member.write(_npy_header(array))
                        chunks = []
                        chunk_shape = grid_chunk_shape(array.shape, array.dtype.itemsize, target)
                        for chunk in array_chunks(array.shape, array.dtype.itemsize, chunk_shape):
                            data = chunk_data(array, chunk, chunk_shape)
                            offset = stream.position
                            with stream.data():
                                member.write(byte_view(data))
                            crc = crc32c_of([data])
                            chunks.append(
                                ChunkRecord(ARCHIVE, offset, data.nbytes, data.nbytes, crc)
                            )
                    records[name] = BlobRecord(name, array.dtype.str, array.shape, tuple(chunks))
            gaps = stream.finish()
        return WrittenDB(records, tuple(gaps))


def _npy_header(array: np.ndarray[Any, Any]) -> bytes:
    header = io.BytesIO()
    fields = {
        "descr": np.lib.format.dtype_to_descr(array.dtype),
        "fortran_order": False,
        "shape": array.shape,
    }
    np.lib.format.write_array_header_1_0(header, fields)
    return header.getvalue()


class _GapRecorder(io.RawIOBase):
    """Passes writes through, counting the position, and checksums every byte written
    outside :meth:`data` blocks (zip and npy headers) as gap records. It refuses to
    seek, so zipfile streams (data descriptors) instead of rewriting headers."""

    def __init__(self, inner: IO[bytes]) -> None:
        super().__init__()
        self._inner = inner
        self.position = 0
        self._in_data = False
        self._gap_start = 0
        self._gap_crc = 0
        self._gaps: list[ChunkRecord] = []

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def tell(self) -> int:
        return self.position

    def write(self, data: Any) -> int:
        view = byte_view(data)
        if not self._in_data:
            self._gap_crc = crc32c_of([view], self._gap_crc)
        self._inner.write(view)
        self.position += view.nbytes
        return view.nbytes

    @contextlib.contextmanager
    def data(self) -> Iterator[None]:
        self._close_gap()
        self._in_data = True
        try:
            yield
        finally:
            self._in_data = False
            self._gap_start = self.position
            self._gap_crc = 0

    def _close_gap(self) -> None:
        size = self.position - self._gap_start
        if size:
            self._gaps.append(ChunkRecord(ARCHIVE, self._gap_start, size, size, self._gap_crc))

    def finish(self) -> list[ChunkRecord]:
        self._close_gap()
        return self._gaps

    def flush(self) -> None:
        self._inner.flush()

    def close(self) -> None:
        # the underlying stream is closed by its own context manager
        super().close()


@hookimpl
def ckptstore_db_types() -> list[type[DBType]]:
    return [NpzDB]
