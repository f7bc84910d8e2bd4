"""The ``zarr`` DB type: groups plain zarr reads (one ZIP per node checkpoint, or a
directory when compressed), compression, names and dtypes it refuses, no padding, and
partial loads that read only what they need."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import zarr
from ckpt_helpers import (
    SMALL_CHUNKS,
    data_key,
    engine,
    flip_byte,
    memory_root,
    node_dir,
    partial_load,
)

from ckptstore import CorruptCheckpointError, protocol
from ckptstore.errors import UnsupportedBlobError
from ckptstore.formats import _zarr_db
from ckptstore.formats._zarr_db import ZarrDB
from ckptstore.io import IOSettings, ParallelIO
from ckptstore.paths import FsspecPath, LocalPath
from ckptstore.plugin import PositionalReader
from ckptstore.plugin._path_type import PathType
from ckptstore.plugin._registry import Registry

NODE = "trainer_0"


def zarr_blobs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {
        "model/layer1/w": rng.normal(size=(37, 29)),  # several padded chunks
        "model/layer1/b": np.zeros(29, dtype=np.float32),
        "model/w_fortran": np.asfortranarray(rng.normal(size=(8, 6))),
        "strided": np.arange(300, dtype=np.int16)[::3],
        "big_endian": np.arange(6, dtype=">i8").reshape(3, 2),
        "half": np.linspace(0, 1, 5, dtype=np.float16),
        "complex": np.array([1 + 2j, 3 - 4j], dtype=np.complex64),
        "flags": np.array([True, False, True]),
        "counts": np.arange(4, dtype=np.uint64),
        "scalar": np.array(42, dtype=np.int64),
        "empty": np.zeros((0, 3), dtype=np.float32),
    }


def open_plain(directory: Path, compression: str | None = None) -> zarr.Group:
    """The node checkpoint opened by plain zarr-python, as docs/reading-without-ckptstore.md
    says: the ZIP store for raw checkpoints, the directory for compressed ones."""
    if compression is None:
        store = zarr.storage.ZipStore(directory / "blobs.zarr.zip", mode="r")
        return zarr.open_group(store, mode="r")
    return zarr.open_group(str(directory), mode="r")


def save(storage: PathType, values: dict[str, np.ndarray], db: ZarrDB | None = None) -> None:
    commit = protocol.write_node(storage, NODE, 1, values, db or ZarrDB(), engine())
    protocol.commit_epoch(storage, 1, [commit])


@pytest.mark.parametrize("compression", [None, "zstd", "blosc"])
def test_groups_open_with_plain_zarr(tmp_path: Path, compression: str | None) -> None:
    values = zarr_blobs()
    save(LocalPath(str(tmp_path)), values, ZarrDB(compression=compression))
    group = open_plain(node_dir(tmp_path, "trainer_0", 1), compression)
    for name, value in values.items():
        array = group[name]
        assert isinstance(array, zarr.Array)
        assert array.dtype == value.dtype.newbyteorder("=")  # zarr reads native order
        np.testing.assert_array_equal(array[...], value)
    model = group["model"]
    assert isinstance(model, zarr.Group)
    assert sorted(model.group_keys()) == ["layer1"]


@pytest.mark.parametrize("compression", [None, "zstd", "blosc"])
def test_ckptstore_reads_back_every_dtype_and_layout(compression: str | None) -> None:
    values = zarr_blobs()
    with memory_root() as url:
        storage = FsspecPath(url)
        db = ZarrDB(compression=compression, level=5)
        save(storage, values, db)
        manifest = protocol.open_node(storage, NODE, 1)
        loaded = protocol.read_blobs(storage, manifest, None, db, engine())
    for name, value in values.items():
        assert loaded[name].dtype == value.dtype
        np.testing.assert_array_equal(loaded[name], value)
    codecs = {record.codec for record in manifest.blobs.values()}
    assert codecs == {compression or "raw"}


def test_compression_shrinks_compressible_data(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    save(storage, {"zeros": np.zeros(10_000)}, ZarrDB(compression="zstd"))
    manifest = protocol.open_node(storage, NODE, 1)
    assert manifest.blobs["zeros"].stored_bytes < manifest.blobs["zeros"].nbytes / 10
    assert protocol.verify_node(storage, NODE, 1, ZarrDB(), engine()) == []


def test_unknown_compressions_are_refused() -> None:
    with pytest.raises(ValueError, match="compression"):
        ZarrDB(compression="lz4")
    assert repr(ZarrDB("zstd", 7)) == "ZarrDB(compression='zstd', level=7)"


def test_blobs_are_packed_unpadded_and_every_piece_is_checksummed(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    values = np.arange(1000, dtype=np.float64)  # 8000 bytes: pieces of 4096 and 3904
    save(storage, {"w": values})
    assert sorted(p.name for p in (node_dir(tmp_path, "trainer_0", 1)).iterdir()) == [
        "blobs.zarr.zip",
        "ckptstore.manifest.json",
    ]
    record = protocol.open_node(storage, NODE, 1).blobs["w"]
    assert [(c.size, c.stored) for c in record.chunks] == [(4096, 4096), (3904, 3904)]
    assert record.chunks[1].offset == record.chunks[0].offset + 4096
    array = open_plain(node_dir(tmp_path, "trainer_0", 1))["w"]
    assert isinstance(array, zarr.Array)
    assert array.chunks == (1000,)  # one chunk per array: no edge padding
    np.testing.assert_array_equal(array[:], values)
    flip_byte(node_dir(tmp_path, "trainer_0", 1) / "blobs.zarr.zip", record.chunks[1].offset + 10)
    (problem,) = protocol.verify_node(storage, NODE, 1, ZarrDB(), engine())
    assert (problem.blob, problem.chunk) == ("w", 1)
    manifest = protocol.open_node(storage, NODE, 1)
    with pytest.raises(CorruptCheckpointError):
        protocol.read_blobs(storage, manifest, ["w"], ZarrDB(), engine())


def test_compressed_edge_chunks_are_padded_and_the_padding_is_checksummed(
    tmp_path: Path,
) -> None:
    storage = LocalPath(str(tmp_path))
    values = np.arange(1000, dtype=np.float64)  # 512 items a chunk: the second is short
    save(storage, {"w": values}, ZarrDB(compression="zstd"))
    record = protocol.open_node(storage, NODE, 1).blobs["w"]
    assert [c.size for c in record.chunks] == [4096, 3904]
    flip_byte(node_dir(tmp_path, "trainer_0", 1) / "w" / "c.1", 5)
    (problem,) = protocol.verify_node(storage, NODE, 1, ZarrDB(), engine())
    assert (problem.blob, problem.chunk) == ("w", 1)


def test_every_format_byte_is_checksummed(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    save(storage, {"a/b": np.zeros(3)})
    manifest = protocol.open_node(storage, NODE, 1)
    archive = node_dir(tmp_path, "trainer_0", 1) / "blobs.zarr.zip"
    covered = sorted((f.offset, f.stored) for f in manifest.files)
    position = 0
    for offset, stored in covered:  # one run (headers, documents, data), the directory
        assert offset == position
        position += stored
    assert position == archive.stat().st_size
    (chunk,) = manifest.blobs["a/b"].chunks  # the blob's range, inside the run's
    assert covered[0][0] < chunk.offset
    assert chunk.offset + chunk.stored <= covered[0][0] + covered[0][1]
    document = archive.read_bytes().index(b'"node_type":"group"')
    flip_byte(archive, document + 3)
    (problem,) = protocol.verify_node(storage, NODE, 1, ZarrDB(), engine())
    assert problem.file is not None
    assert problem.file.endswith("blobs.zarr.zip")


def test_array_documents_are_stored_deflated_and_damage_to_them_is_found(
    tmp_path: Path,
) -> None:
    """Each array's ``zarr.json`` is a deflated ZIP member (293 bytes stored in 179 for
    a float32 vector): plain zarr inflates it, and a flipped byte in it is reported."""
    storage = LocalPath(str(tmp_path))
    values = {f"layer{i}": np.full(1024, i, dtype=np.float32) for i in range(3)}
    save(storage, values)
    archive = node_dir(tmp_path, "trainer_0", 1) / "blobs.zarr.zip"
    with zipfile.ZipFile(archive) as opened:
        assert opened.testzip() is None
        info = opened.getinfo("layer1/zarr.json")
        assert info.compress_type == zipfile.ZIP_DEFLATED
        assert info.compress_size < 0.65 * info.file_size
        assert json.loads(opened.read("layer1/zarr.json"))["shape"] == [1024]
        assert opened.getinfo("layer1/0").compress_type == zipfile.ZIP_STORED
    group = open_plain(node_dir(tmp_path, "trainer_0", 1))
    for name, value in values.items():
        np.testing.assert_array_equal(group[name][:], value)
    with zipfile.ZipFile(archive) as opened:
        info = opened.getinfo("layer1/zarr.json")
        inside = info.header_offset + 30 + len(info.filename) + info.compress_size // 2
    flip_byte(archive, inside)
    (problem,) = protocol.verify_node(storage, NODE, 1, ZarrDB(), engine())
    assert problem.file is not None
    assert problem.file.endswith("blobs.zarr.zip")
    assert problem.blob is None  # a format range: the blobs' own bytes are intact


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"a": np.zeros(1), "a/b": np.zeros(1)}, "'a' is an array"),
        ({"x/y": np.zeros(1), "x/y/z/w": np.zeros(1)}, "'x/y' is an array"),
        ({"__hidden": np.zeros(1)}, "reserves"),
        ({"a/zarr.json": np.zeros(1)}, "reserves"),
        ({"ckptstore.manifest.json": np.zeros(1)}, "manifest"),
        ({"ckptstore.manifest.json/x": np.zeros(1)}, "manifest"),
    ],
)
def test_blobs_zarr_cannot_hold_are_refused_clearly(
    tmp_path: Path, values: dict[str, np.ndarray], message: str
) -> None:
    storage = LocalPath(str(tmp_path))
    with pytest.raises(UnsupportedBlobError, match=message):
        protocol.write_node(storage, NODE, 1, values, ZarrDB(), engine())
    assert [path for path in tmp_path.rglob("*") if path.is_file()] == []


def test_a_blob_may_be_named_like_the_manifest_below_the_top_level(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    save(storage, {"sub/ckptstore.manifest.json": np.ones(2)})
    manifest = protocol.open_node(storage, NODE, 1)
    assert list(manifest.blobs) == ["sub/ckptstore.manifest.json"]


def test_partial_loads_read_only_the_requested_blobs_bytes(
    tmp_path: Path, registry: Registry
) -> None:
    session, storage = partial_load(tmp_path, registry, "zarr", ["b", "c"], io=SMALL_CHUNKS)
    assert session.workspace("reader")["b"].tolist() == list(range(10))
    (read,) = storage.chunk_reads.items()
    assert read[0] == f"{data_key(LocalPath(str(tmp_path)), 'trainer_0', 1)}/blobs.zarr.zip"
    # b and c, and the few hundred bytes of ZIP headers and zarr documents between them
    # (neighbouring ranges are read with one request); never a's 40,000 bytes
    assert 40 + 2400 <= read[1] < 40 + 2400 + 1024
    assert sorted(storage.document_reads) == [
        "_ckptstore/epoch-1/trainer_0.commit.json",
        f"{data_key(LocalPath(str(tmp_path)), 'trainer_0', 1)}/ckptstore.manifest.json",
    ]


def other_values() -> dict[str, np.ndarray]:
    """Dtypes beyond zarr's core ones, stored with the data types zarr-python defines."""
    return {
        "bytes": np.array([b"ab", b"c\x00d", b""], dtype="S3"),
        "text": np.array(["é✓", "x", ""], dtype=">U2"),
        "when": np.array(["2024-02-29T12:00", "NaT"], dtype=">M8[ns]"),
        "every": np.array([2, -3], dtype="<m8[25ms]"),
        "long": np.array([1.5, -0.0], dtype=np.longdouble),
    }


@pytest.mark.parametrize("compression", [None, "zstd", "blosc"])
def test_strings_datetimes_and_longdouble_open_with_plain_zarr(
    tmp_path: Path, compression: str | None
) -> None:
    storage = LocalPath(str(tmp_path))
    values = other_values()
    save(storage, values, ZarrDB(compression=compression))
    group = open_plain(node_dir(tmp_path, "trainer_0", 1), compression)
    for name, value in values.items():
        read = np.asarray(group[name][...])
        if value.dtype.kind == "f":  # zarr has no longdouble: its raw bytes
            assert read.dtype == np.dtype(f"V{value.itemsize}")
        else:
            assert read.dtype.kind == value.dtype.kind, name
            read = read.astype(value.dtype)
        assert read.tobytes() == value.tobytes(), name


def test_ml_dtypes_open_with_plain_zarr_as_unsigned_integers_with_their_type_named(
    tmp_path: Path,
) -> None:
    storage = LocalPath(str(tmp_path))
    values = {
        "bf16": np.array([1.5, -0.0, np.nan], dtype=ml_dtypes.bfloat16),
        "f8": np.array([0.5, -2.0], dtype=ml_dtypes.float8_e4m3fn),
    }
    save(storage, values)
    group = open_plain(node_dir(tmp_path, "trainer_0", 1))
    assert group["bf16"].attrs["ckptstore_dtype"] == "<ml_dtypes.bfloat16"
    assert group["f8"].attrs["ckptstore_dtype"] == "|ml_dtypes.float8_e4m3fn"
    for name, value in values.items():
        read = np.asarray(group[name][...])
        assert read.dtype == np.dtype(f"u{value.itemsize}")
        assert read.view(value.dtype).tobytes() == value.tobytes()


@pytest.fixture
def small_large_arrays(monkeypatch: pytest.MonkeyPatch) -> None:
    """Arrays of more than 64 KiB count as large (64 MiB by default), cut into chunks of
    at most 16 KiB (16 MiB), so that tests of the large-array layout stay small."""
    monkeypatch.setattr(_zarr_db, "CHUNKED_FROM", 64 << 10)
    monkeypatch.setattr(_zarr_db, "CHUNK_BYTES", 16 << 10)


def large_values() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    return {
        "rows": rng.normal(size=(1009, 16)),  # 126 KiB, 128-byte rows: 128 per chunk at most
        "vector": np.arange(20_000, dtype=">i4"),  # 78 KiB, big-endian
        "wide": rng.normal(size=(3, 8000)).astype(np.float32),  # rows of 31 KiB: cut along
        "fortran": np.asfortranarray(rng.normal(size=(300, 40))),  # copied chunk by chunk
        "small": np.arange(10.0),  # one chunk, as before
    }


def test_large_arrays_are_chunks_each_its_own_member(
    tmp_path: Path, small_large_arrays: None
) -> None:
    """An array over ``CHUNKED_FROM`` is a regular zarr chunk grid of chunks of at most
    ``CHUNK_BYTES``, each chunk a ZIP member of its own (so a plain reader reads a
    slice without the rest), an edge chunk padded with zeros as zarr wants; plain zarr
    and ckptstore read every array back, and the manifest's ranges tile each blob."""
    storage = LocalPath(str(tmp_path))
    values = large_values()
    save(storage, values)
    group = open_plain(node_dir(tmp_path, "trainer_0", 1))
    with zipfile.ZipFile(node_dir(tmp_path, "trainer_0", 1) / "blobs.zarr.zip") as opened:
        assert opened.testzip() is None
        members = set(opened.namelist())
    for name, value in values.items():
        array = group[name]
        assert isinstance(array, zarr.Array)
        np.testing.assert_array_equal(array[...], value)
        chunk_bytes = int(np.prod(array.chunks)) * value.dtype.itemsize
        if name == "small":
            assert array.chunks == value.shape
            continue
        assert chunk_bytes <= 16 << 10
        grid = [-(-size // chunk) for size, chunk in zip(value.shape, array.chunks, strict=True)]
        assert {f"{name}/{'.'.join(map(str, index))}" for index in np.ndindex(*grid)} <= members
    assert group["rows"].chunks == (101, 16)  # 10 chunks of 101 rows: 1 of padding
    assert group["wide"].chunks == (1, 4000)  # rows too long: cut along the last axis
    manifest = protocol.open_node(storage, NODE, 1)
    padding = [c for c in manifest.blobs["rows"].chunks if c.size == 0]
    assert [c.stored for c in padding] == [1 * 16 * 8]
    loaded = protocol.read_blobs(storage, manifest, None, ZarrDB(), engine())
    for name, value in values.items():
        assert loaded[name].dtype == value.dtype
        np.testing.assert_array_equal(loaded[name], value)
    assert protocol.verify_node(storage, NODE, 1, ZarrDB(), engine()) == []


def test_a_flipped_byte_in_an_edge_chunks_padding_is_found(
    tmp_path: Path, small_large_arrays: None
) -> None:
    """The padding of an edge chunk is under the blob's records (a range supplying no
    bytes of it), so verify and a checked load find damage to it."""
    storage = LocalPath(str(tmp_path))
    save(storage, large_values())
    manifest = protocol.open_node(storage, NODE, 1)
    (padding,) = [c for c in manifest.blobs["rows"].chunks if c.size == 0]
    flip_byte(node_dir(tmp_path, "trainer_0", 1) / "blobs.zarr.zip", padding.offset + 3)
    (problem,) = protocol.verify_node(storage, NODE, 1, ZarrDB(), engine())
    assert problem.blob == "rows"
    with pytest.raises(CorruptCheckpointError):
        protocol.read_blobs(storage, manifest, ["rows"], ZarrDB(), engine())
    loaded = protocol.read_blobs(storage, manifest, ["vector"], ZarrDB(), engine())
    np.testing.assert_array_equal(loaded["vector"], large_values()["vector"])


def test_large_arrays_chunk_the_first_axis_and_pad_little() -> None:
    """Chunks of at most ``CHUNK_BYTES`` along the first axis when its rows fit, with
    the step that pads least among those from half the most up."""
    itemsize = 4
    for shape in [(1 << 14, 1 << 14), (1009, 1 << 16), (5, 7, 1 << 22), (1 << 25,)]:
        chunk_shape = _zarr_db._large_chunk_shape(shape, itemsize)
        assert int(np.prod(chunk_shape)) * itemsize <= _zarr_db.CHUNK_BYTES
        assert int(np.prod(chunk_shape)) * itemsize > _zarr_db.CHUNK_BYTES // 2
        padded = [-(-n // c) * c for n, c in zip(shape, chunk_shape, strict=True)]
        assert int(np.prod(padded)) <= int(np.prod(shape)) * 1.01
    assert _zarr_db._large_chunk_shape((1 << 14, 1 << 14), itemsize) == (256, 1 << 14)
    assert _zarr_db._large_chunk_shape((5, 7, 1 << 22), itemsize) == (1, 1, 1 << 22)


def test_every_member_name_is_written_once(tmp_path: Path, small_large_arrays: None) -> None:
    """No duplicate members (zipfile takes the last of two, TensorStore refuses both)."""
    save(LocalPath(str(tmp_path)), large_values())
    with zipfile.ZipFile(node_dir(tmp_path, "trainer_0", 1) / "blobs.zarr.zip") as opened:
        names = opened.namelist()
    assert len(names) == len(set(names))


def test_arrays_of_few_huge_items_are_chunks_of_one_item(
    tmp_path: Path, small_large_arrays: None
) -> None:
    """A 0-d array, or one whose items are each larger than a chunk, above
    ``CHUNKED_FROM`` (fixed-width bytes can be): one chunk per item, read back."""
    values = {
        "one": np.array(b"x" * (80 << 10), dtype="S81920"),
        "few": np.array([b"a" * (40 << 10), b"b"], dtype="S40960"),
    }
    storage = LocalPath(str(tmp_path))
    save(storage, values)
    group = open_plain(node_dir(tmp_path, "trainer_0", 1))
    assert group["few"].chunks == (1,)
    loaded = protocol.read_blobs(
        storage, protocol.open_node(storage, NODE, 1), None, ZarrDB(), engine()
    )
    for name, value in values.items():
        np.testing.assert_array_equal(group[name][...], value)
        np.testing.assert_array_equal(loaded[name], value)


class OpenCountingPath(LocalPath):
    """Local disk counting the readers opened (one per read request that checks in
    windows)."""

    name = "open_counting_local"
    protocols = ()

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.opens = 0

    def open_reader(self, key: str) -> PositionalReader:
        self.opens += 1
        return super().open_reader(key)


def test_a_large_arrays_neighbouring_chunks_are_read_together_and_checked_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large array's chunks (each its own member) are read in requests as long as the
    engine's chunk, not one each: the device sees reads as long as an unchunked member's
    pieces. Each chunk is still checked against its own CRC: damage is named by blob and
    chunk, and the chunks around it load from other requests as before."""
    monkeypatch.setattr(_zarr_db, "CHUNKED_FROM", 1 << 20)
    monkeypatch.setattr(_zarr_db, "CHUNK_BYTES", 512 << 10)  # above ALONE_FROM: large reads
    value = np.random.default_rng(11).normal(size=(320, 1024))  # 2.5 MiB: 5 chunks of 64 rows
    storage = OpenCountingPath(str(tmp_path))
    commit = protocol.write_node(storage, NODE, 1, {"w": value}, ZarrDB(), ParallelIO())
    protocol.commit_epoch(storage, 1, [commit])
    manifest = protocol.open_node(storage, NODE, 1)
    chunks = manifest.blobs["w"].chunks
    assert [c.size for c in chunks] == [512 << 10] * 5
    reads = ParallelIO(IOSettings(chunk_bytes=1 << 20))  # two chunks a request
    storage.opens = 0
    loaded = protocol.read_blobs(storage, manifest, None, ZarrDB(), reads)
    np.testing.assert_array_equal(loaded["w"], value)
    assert storage.opens == 3  # 2 + 2 + 1 chunks, not 5 requests
    flip_byte(node_dir(tmp_path, "trainer_0", 1) / "blobs.zarr.zip", chunks[3].offset + 100)
    with pytest.raises(CorruptCheckpointError) as info:
        protocol.read_blobs(storage, manifest, None, ZarrDB(), reads)
    assert (info.value.blob, info.value.chunk) == ("w", 3)
