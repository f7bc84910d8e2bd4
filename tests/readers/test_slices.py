"""A plain reader reads a slice of a large array without the rest: zarr-python, through
fsspec's ZIP reader (what ``zip::s3://`` URLs use), reading an eighth of a 512 MiB
array ckptstore saved fetches about that eighth from the file, where an array stored
as one member would be read whole."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from fsspec.implementations.zip import ZipFileSystem

from ckptstore.protocol import _commit as protocol
from ckptstore.protocol._location import CheckpointLocation


class CountingFile(io.FileIO):
    """A file that counts the bytes read from it."""

    fetched = 0

    def read(self, size: int = -1, /) -> bytes:
        data = super().read(size)
        self.fetched += len(data)
        return data

    def readinto(self, buffer: Any, /) -> int:
        count = super().readinto(buffer) or 0
        self.fetched += count
        return count


def test_an_eighth_of_a_512_mib_array_reads_at_most_1_1x_its_bytes(tmp_path: Path) -> None:
    weights = np.arange(1 << 27, dtype=np.float32).reshape(8192, 16384)  # 512 MiB
    location = CheckpointLocation.open(str(tmp_path), "zarr")
    written = protocol.write_node(
        location.storage, "trainer_0", 1, {"w": weights}, location.db_type, location.engine()
    )
    counting = CountingFile(tmp_path / written.data_key / "blobs.zarr.zip")
    with counting:
        mapper = ZipFileSystem(fo=counting).get_mapper("")
        store = zarr.storage.FsspecStore.from_mapper(mapper, read_only=True)
        group = zarr.open_group(store, mode="r")
        array = group["w"]
        assert isinstance(array, zarr.Array)
        for eighth in (0, 5):  # the first eighth, and one inside
            rows = slice(eighth * 1024, (eighth + 1) * 1024)
            before = counting.fetched
            part = array[rows]
            fetched = counting.fetched - before
            np.testing.assert_array_equal(part, weights[rows])
            assert part.nbytes <= fetched <= 1.1 * part.nbytes
