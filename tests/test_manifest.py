"""Node manifests: round trips, and everything a malformed manifest could smuggle in."""

from __future__ import annotations

import copy
import gzip
import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptstore import CorruptCheckpointError
from ckptstore.errors import JobConfigurationError, UnsupportedBlobError
from ckptstore.records import BlobRecord, ChunkRecord, NodeManifest
from ckptstore.records._documents import GZIP_MAGIC, encode_document
from ckptstore.records._limits import Limits, current_limits, set_limits
from ckptstore.records._manifest import GZIP_MANIFESTS_LARGER_THAN, MANIFEST_KIND, safe_dtype


def manifest() -> NodeManifest:
    w = BlobRecord(
        "trainer_0/w",
        "<f4",
        (2, 3),
        (
            ChunkRecord("trainer_0/w/c.0", 0, 16, 12, 11),
            ChunkRecord("trainer_0/w/c.1", 0, 12, 12, 22),
        ),
        layout={"chunk_shape": [1, 3]},
    )
    step = BlobRecord("step", "<i8", (), (ChunkRecord("blobs.npz", 100, 8, 8, 33),))
    name = BlobRecord("name", "<U4", (1,), (ChunkRecord("blobs.npz", 200, 16, 16, 44),))
    return NodeManifest(
        "trainer_0",
        5,
        "zarr",
        {"trainer_0/w": w, "step": step, "name": name},
        (ChunkRecord("zarr.json", 0, 50, 50, 55),),
        created="2026-01-01T00:00:00+00:00",
    )


def decode(data: bytes) -> NodeManifest:
    return NodeManifest.decode(data, url="/ckpt", key="trainer_0.5/ckptstore.manifest.json")


def body() -> dict[str, Any]:
    original = manifest()
    return {
        "node": original.node,
        "epoch": original.epoch,
        "db_type": original.db_type,
        "checksum": "crc32",
        "created": original.created,
        "blobs": {name: record.encode() for name, record in original.blobs.items()},
        "files": [chunk.encode() for chunk in original.files],
    }


def test_round_trip() -> None:
    original = manifest()
    decoded = decode(original.encode())
    assert decoded == original
    assert decoded.nbytes == 24 + 8 + 16
    assert decoded.stored_bytes == 16 + 12 + 8 + 16 + 50
    assert decoded.blobs["trainer_0/w"].numpy_dtype() == np.dtype("<f4")
    assert decoded.blobs["trainer_0/w"].stored_bytes == 28


def test_records_leave_out_defaults_and_the_full_form_still_decodes() -> None:
    """A raw record without layout is encoded without ``codec`` and ``layout``; the
    full form that manifests carried before decodes to the same record."""
    encoded = body()
    assert encoded["blobs"]["step"] == {
        "dtype": "<i8",
        "shape": [],
        "chunks": [["blobs.npz", 100, 8, 8, 33]],
    }
    assert encoded["blobs"]["trainer_0/w"]["layout"] == {"chunk_shape": [1, 3]}
    for record in encoded["blobs"].values():
        record.setdefault("codec", "raw")
        record.setdefault("layout", {})
    full = encode_document(MANIFEST_KIND, encoded)
    assert b'"codec":"raw"' in full
    assert decode(full) == manifest()
    assert len(manifest().encode()) < len(full)


def test_encoding_is_deterministic() -> None:
    assert manifest().encode() == manifest().encode()


@pytest.mark.parametrize("text", ["<f8", "|b1", "<c16", "|S3", "<U3", "<M8[ns]", "<m8[s]", ">i2"])
def test_plain_dtypes_are_safe(text: str) -> None:
    assert safe_dtype(text, "x") == np.dtype(text)


@pytest.mark.parametrize(
    "text", ["O", "|O", "V8", "i4,f8", "i4,O", "(2,)i4", "bogus", "[('a', '<i4')]"]
)
def test_object_structured_void_and_unknown_dtypes_are_refused(text: str) -> None:
    with pytest.raises(UnsupportedBlobError):
        safe_dtype(text, "x")


def edit(change: Callable[[dict[str, Any]], None]) -> bytes:
    document = copy.deepcopy(body())
    change(document)
    return encode_document(MANIFEST_KIND, document)


def set_chunk(field: int, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(document: dict[str, Any]) -> None:
        document["blobs"]["step"]["chunks"][0][field] = value

    return change


MALFORMED: dict[str, Callable[[dict[str, Any]], None]] = {
    "object dtype": lambda d: d["blobs"]["step"].update(dtype="|O"),
    "structured dtype": lambda d: d["blobs"]["step"].update(dtype="i4,i4"),
    "subarray dtype": lambda d: d["blobs"]["step"].update(dtype="(1,)i8"),
    "negative offset": set_chunk(1, -1),
    "negative stored": set_chunk(2, -8),
    "negative size": set_chunk(3, -8),
    "negative crc": set_chunk(4, -1),
    "boolean size": set_chunk(3, True),
    "float size": set_chunk(3, 8.0),
    "escaping chunk key": set_chunk(0, "../../etc/passwd"),
    "absolute chunk key": set_chunk(0, "/etc/passwd"),
    "backslash chunk key": set_chunk(0, "..\\x"),
    "escaping file key": lambda d: d["files"][0].__setitem__(0, "../zarr.json"),
    "short chunk record": lambda d: d["blobs"]["step"]["chunks"][0].pop(),
    "escaping blob name": lambda d: d["blobs"].update({"../x": d["blobs"].pop("step")}),
    "escaping node name": lambda d: d.update(node="../trainer_0"),
    "negative epoch": lambda d: d.update(epoch=-1),
    "text epoch": lambda d: d.update(epoch="5"),
    "negative dimension": lambda d: d["blobs"]["name"].update(shape=[-1]),
    "text dimension": lambda d: d["blobs"]["name"].update(shape=["1"]),
    "shape not a list": lambda d: d["blobs"]["name"].update(shape=1),
    "chunks short of the shape": lambda d: d["blobs"]["name"].update(shape=[2]),
    "stored shorter than size": lambda d: d["blobs"]["trainer_0/w"]["chunks"][0].__setitem__(2, 4),
    "missing dtype": lambda d: d["blobs"]["step"].pop("dtype"),
    "missing files": lambda d: d.pop("files"),
    "blobs not a mapping": lambda d: d.update(blobs=[1, 2]),
    "unknown checksum": lambda d: d.update(checksum="sha1"),
    "checksum not a name": lambda d: d.update(checksum=["crc32"]),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_manifests_are_refused(case: str) -> None:
    with pytest.raises(CorruptCheckpointError, match="manifest is malformed") as info:
        decode(edit(MALFORMED[case]))
    assert info.value.file == "trainer_0.5/ckptstore.manifest.json"


def test_new_manifests_record_crc32_and_earlier_ones_read_as_crc32c() -> None:
    """A save records CRC-32 (one pass serves the manifest and the ZIP format); manifests
    written before said ``"crc32c"`` (the oldest said nothing): each chunk decodes with
    its manifest's algorithm, so loads and ``verify`` check it with the right one."""
    assert b'"checksum":"crc32"' in manifest().encode()
    assert {c.algorithm for r in decode(manifest().encode()).blobs.values() for c in r.chunks} == {
        "crc32"
    }
    for change in (lambda d: d.update(checksum="crc32c"), lambda d: d.pop("checksum")):
        earlier = decode(edit(change))
        chunks = [c for r in earlier.blobs.values() for c in r.chunks] + list(earlier.files)
        assert {chunk.algorithm for chunk in chunks} == {"crc32c"}
        assert b'"checksum":"crc32c"' in earlier.encode()  # re-encoded (a copy): unchanged


def test_a_manifest_mixing_checksum_algorithms_is_never_written() -> None:
    original = manifest()
    step = BlobRecord("step", "<i8", (), (ChunkRecord("blobs.npz", 100, 8, 8, 33, "crc32c"),))
    mixed = NodeManifest("trainer_0", 5, "zarr", {**original.blobs, "step": step})
    with pytest.raises(JobConfigurationError, match=r"\['crc32', 'crc32c'\]"):
        mixed.encode()
    unknown = replace(step, chunks=(replace(step.chunks[0], algorithm="sha1"),))
    alone = NodeManifest("trainer_0", 5, "npz", {"step": unknown})
    with pytest.raises(JobConfigurationError, match=r"\['sha1'\]"):
        alone.encode()


def test_a_damaged_manifest_is_refused_before_it_is_parsed() -> None:
    data = bytearray(manifest().encode())
    data[data.index(b'"zarr"') + 1] ^= 0x04  # still valid JSON: "varr"
    with pytest.raises(CorruptCheckpointError, match="CRC-32C"):
        decode(bytes(data))


def test_the_same_bytes_are_decoded_once_and_shared_read_only() -> None:
    data = manifest().encode()
    first = decode(data)
    assert decode(bytes(bytearray(data))) is first  # equal bytes, not the same object
    with pytest.raises(TypeError):
        first.blobs["step"] = first.blobs["name"]  # type: ignore[index]
    other = replace_created(data)
    assert decode(other) is not first
    assert decode(other).blobs == first.blobs


def test_a_remembered_manifest_is_checked_again_under_stricter_limits() -> None:
    data = manifest().encode()
    decode(data)
    try:
        set_limits(Limits(max_blobs=2))
        with pytest.raises(CorruptCheckpointError, match="limit of 2 blobs"):
            decode(data)
    finally:
        set_limits(None)
    assert len(decode(data).blobs) == 3


def replace_created(data: bytes) -> bytes:
    original = manifest()
    return NodeManifest(
        original.node,
        original.epoch,
        original.db_type,
        original.blobs,
        original.files,
        created="2026-01-02T00:00:00+00:00",
    ).encode()


_ANY = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-2, 1 << 62),
    st.floats(allow_nan=False),
    st.text(max_size=4),
)


@st.composite
def _records(draw: st.DrawFn) -> dict[str, object]:
    """Blob records as a manifest might hold them: mostly of the plain form (dtype,
    shape and one chunk, often a consistent one), with any field possibly wrong."""
    dtype = draw(st.sampled_from(["<f4", "|u1", "<i8", "|b1", "<U4", "|O", "<V8", "x", "<f16"]))
    shape = draw(st.lists(st.integers(0, 9), max_size=draw(st.sampled_from([1, 1, 4]))))
    itemsize = {"<f4": 4, "|u1": 1, "<i8": 8, "|b1": 1, "<U4": 16}.get(dtype, 8)
    nbytes = math.prod(shape) * itemsize
    size = draw(st.sampled_from([nbytes, nbytes, nbytes + 1, max(0, nbytes - 1), 1 << 50]))
    stored = draw(st.sampled_from([size, size + 8, max(0, size - 1)]))
    chunk: object = ["blobs.npz", draw(st.integers(0, 9)), stored, size, draw(st.integers(0, 9))]
    chunks: object = [chunk]
    fields = {"dtype": dtype, "shape": shape, "chunks": chunks}
    broken = draw(st.booleans())  # half the records keep the plain form's types
    keys = ["dtype", "shape", "chunks", "chunk0", "shape0"]
    for key in draw(st.sets(st.sampled_from(keys), min_size=1)) if broken else ():
        if key == "chunk0":
            fields["chunks"] = [draw(st.one_of(_ANY, st.lists(_ANY, max_size=6)))]
        elif key == "shape0" and shape:
            fields["shape"] = [draw(_ANY), *shape[1:]]
        else:
            fields[key] = draw(st.one_of(_ANY, st.lists(_ANY, max_size=3)))
    extra = draw(st.sampled_from([{}, {}, {"codec": "raw"}, {"layout": {}}, {"shape2": 1}]))
    if draw(st.booleans()):
        chunks_list = fields["chunks"]
        if isinstance(chunks_list, list):
            fields["chunks"] = chunks_list * 2
    return {**fields, **extra}


def _outcome(name: str, raw: object) -> tuple[object, ...]:
    try:
        return ("record", BlobRecord.decode(name, raw))
    except Exception as error:  # the same error, whichever path raised it
        return ("error", type(error), str(error))


@settings(max_examples=400, deadline=None)
@given(raw=_records())
def test_the_fast_path_for_plain_records_decodes_as_the_full_checks_do(
    raw: dict[str, object],
) -> None:
    """Plain records (dtype, shape, one raw chunk) skip the general checks' generality,
    never their outcome: every record decodes to the same record, or is refused with
    the same error, with the fast path and without it."""
    tight = Limits(max_ndim=1, max_chunks=1, max_blob_bytes=16)
    for limits in (None, tight):
        set_limits(limits)
        try:
            fast = _outcome("w", raw)
            with mock.patch.object(BlobRecord, "_decode_plain", classmethod(lambda *a: None)):
                full = _outcome("w", raw)
        finally:
            set_limits(None)
        assert fast == full


def test_plain_records_take_the_fast_path() -> None:
    raw = {"dtype": "<f4", "shape": [2, 3], "chunks": [["blobs.npz", 0, 24, 24, 7]]}
    record = BlobRecord._decode_plain("w", raw, current_limits(), "crc32")
    assert record == BlobRecord("w", "<f4", (2, 3), (ChunkRecord("blobs.npz", 0, 24, 24, 7),))
    assert (
        BlobRecord._decode_plain("w", {**raw, "shape": [2, 4]}, current_limits(), "crc32") is None
    )


# -- large manifests are stored gzip-compressed ------------------------------------------


def many_blobs(count: int, created: str = "2026-01-01T00:00:00+00:00") -> NodeManifest:
    """A packed node's manifest of ``count`` small blobs (~100 bytes of JSON each)."""
    records = {
        f"layer{i // 100}/w{i}": BlobRecord(
            f"layer{i // 100}/w{i}",
            "<f4",
            (4,),
            (ChunkRecord("blobs.zarr.zip", 64 * i, 16, 16, (i * 2654435761) % (1 << 32)),),
        )
        for i in range(count)
    }
    files = (ChunkRecord("blobs.zarr.zip", 64 * count, 100, 100, 7),)
    return NodeManifest("trainer_0", 5, "zarr", records, files, created=created)


def test_a_large_manifest_is_stored_compressed_and_decodes_to_the_same_manifest() -> None:
    original = many_blobs(2000)
    json_bytes = original._encode()
    assert len(json_bytes) > GZIP_MANIFESTS_LARGER_THAN
    data = original.encode()
    assert data.startswith(GZIP_MAGIC)
    assert len(data) < len(json_bytes) // 4
    assert gzip.decompress(data) == json_bytes  # the JSON a small manifest would be
    decoded = decode(data)
    assert decoded == original
    assert decoded is decode(bytes(bytearray(data)))  # remembered by its stored bytes


def test_small_manifests_stay_plain_json_as_before() -> None:
    """Byte for byte what every earlier version wrote: the canonical document."""
    assert manifest().encode() == encode_document(MANIFEST_KIND, body())
    assert manifest().encode().startswith(b'{"crc32c":')


def test_the_threshold_is_on_the_json_size() -> None:
    """JSON of exactly :data:`GZIP_MANIFESTS_LARGER_THAN` bytes stays plain; one byte
    more is compressed."""
    base = many_blobs(600, created="")
    padding = GZIP_MANIFESTS_LARGER_THAN - len(base._encode())
    assert padding > 0
    sized = {}
    for extra in range(-12, 13):  # the CRC-32C's digits vary: find both sizes exactly
        candidate = many_blobs(600, created="x" * (padding + extra))
        sized[len(candidate._encode())] = candidate
    at, above = sized[GZIP_MANIFESTS_LARGER_THAN], sized[GZIP_MANIFESTS_LARGER_THAN + 1]
    assert at.encode() == at._encode()
    assert above.encode().startswith(GZIP_MAGIC)
    assert decode(above.encode()) == above


def test_compressed_encoding_is_deterministic() -> None:
    first, second = many_blobs(2000).encode(), many_blobs(2000).encode()
    assert first == second
    assert first[4:8] == bytes(4)  # no modification time in the gzip header


def test_the_document_limit_bounds_the_json_before_compression() -> None:
    """A save refuses a manifest whose JSON passes ``max_document_bytes`` even when its
    compressed bytes would fit, and a load refuses it too: readers decompress the JSON,
    and hold it."""
    original = many_blobs(2000)
    data = original.encode()  # under the default limits
    json_size = len(original._encode())
    try:
        set_limits(replace(current_limits(), max_document_bytes=json_size - 1))
        assert len(data) < json_size - 1
        with pytest.raises(JobConfigurationError, match=r"bytes of JSON \(before compression\)"):
            original.encode()
        with pytest.raises(CorruptCheckpointError, match="decompresses to more than the limit"):
            decode(data)
        set_limits(replace(current_limits(), max_document_bytes=json_size))
        assert decode(data) == original
        assert original.encode() == data
    finally:
        set_limits(None)


def test_the_json_value_limit_bounds_a_manifest_at_save_and_load() -> None:
    """A save refuses a manifest of more JSON values than ``max_json_values`` (its parsed
    objects, not its bytes, are what a load holds), and a load refuses it as corrupt."""
    original = many_blobs(2000)
    data = original.encode()
    try:
        set_limits(replace(current_limits(), max_json_values=2000 * 5))
        with pytest.raises(JobConfigurationError, match="CKPTSTORE_LIMIT_MAX_JSON_VALUES"):
            original.encode()
        with pytest.raises(CorruptCheckpointError, match="CKPTSTORE_LIMIT_MAX_JSON_VALUES"):
            decode(data)
    finally:
        set_limits(None)
    assert decode(data) == original
