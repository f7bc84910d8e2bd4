"""Control documents: canonical JSON carrying its own CRC-32C."""

from __future__ import annotations

import contextlib
import gzip
import json
import struct
import tracemalloc
import zlib
from collections.abc import Iterator
from dataclasses import replace

import pytest

from ckptstore import CorruptCheckpointError
from ckptstore.io._checksum import crc32c_of
from ckptstore.protocol._commit import EpochCommit, NodeCommit
from ckptstore.records import BlobRecord, ChunkRecord, NodeManifest
from ckptstore.records._documents import (
    GZIP_MAGIC,
    decode_document,
    encode_document,
    gzip_document,
)
from ckptstore.records._limits import Limits, current_limits, set_limits
from tests.attacks.forge import gzip_bomb

KIND = "ckptstore.test"


def decode(data: bytes, kind: str = KIND) -> dict[str, object]:
    return decode_document(data, kind, url="/ckpt", key="doc.json")


def commit_document() -> bytes:
    node = NodeCommit("trainer_0", 4, "zarr", 123456789, 4096, 5000, 3, 17)
    return EpochCommit(4, {"trainer_0": node}, "2026-01-01T00:00:00+00:00").encode()


def test_round_trip_and_shape() -> None:
    body = {"epoch": 3, "nodes": {"b": [1, 2], "a": "x"}, "text": "é"}
    data = encode_document(KIND, body)
    assert data.startswith(b'{"crc32c":')
    assert b" " not in data
    decoded = decode(data)
    assert decoded == {"kind": KIND, "version": 1, **body}
    assert json.loads(data)["crc32c"] == crc32c_of(
        [json.dumps(decoded, sort_keys=True, separators=(",", ":")).encode()]
    )


def test_the_checksum_key_is_reserved() -> None:
    with pytest.raises(ValueError, match="reserved"):
        encode_document(KIND, {"crc32c": 1})


def manifest_document() -> bytes:
    chunk = ChunkRecord("w/c.0", 0, 32, 24, 99)
    record = BlobRecord("w", "<f8", (3,), (chunk,), layout={"chunk_shape": [4]})
    return NodeManifest("trainer_0", 4, "zarr", {"w": record}, created="2026").encode()


def catalog_document() -> bytes:
    entry = {"nodes": ["trainer_0"], "nbytes": 10, "committed_at": "2026", "db_types": ["npz"]}
    return encode_document("ckptstore.catalog", {"epochs": {"3": entry}})


DOCUMENTS = {
    "ckptstore.commit": commit_document,
    "ckptstore.manifest": manifest_document,
    "ckptstore.catalog": catalog_document,
}


def flips_decoded(data: bytes, kind: str) -> list[tuple[int, int, object]]:
    """Each single-bit flip of ``data`` that decodes without an error: (offset, bit,
    what it decoded to)."""
    decoded = []
    for offset in range(len(data)):
        for bit in range(8):
            damaged = bytearray(data)
            damaged[offset] ^= 1 << bit
            try:
                decoded.append((offset, bit, decode(bytes(damaged), kind)))
            except CorruptCheckpointError:
                continue
    return decoded


@pytest.mark.parametrize("kind", sorted(DOCUMENTS))
def test_every_flipped_bit_of_a_control_document_is_detected(kind: str) -> None:
    data = DOCUMENTS[kind]()
    decode(data, kind)
    assert flips_decoded(data, kind) == []


def test_every_flipped_byte_of_a_commit_record_is_detected() -> None:
    data = commit_document()
    for offset in range(len(data)):
        damaged = bytearray(data)
        damaged[offset] ^= 0xFF
        with pytest.raises(CorruptCheckpointError) as info:
            decode(bytes(damaged), "ckptstore.commit")
        assert info.value.file == "doc.json"


def test_truncation_and_garbage_are_detected() -> None:
    data = commit_document()
    for cut in (0, 1, len(data) // 2, len(data) - 1):
        with pytest.raises(CorruptCheckpointError):
            decode(data[:cut], "ckptstore.commit")
    for garbage in (b"\xff\xfe", b"[1, 2]", b'"text"', b"{}", b"null"):
        with pytest.raises(CorruptCheckpointError):
            decode(garbage)


def test_a_document_of_another_kind_is_refused() -> None:
    with pytest.raises(CorruptCheckpointError, match=r"expected a 'ckptstore\.manifest'"):
        decode(commit_document(), "ckptstore.manifest")


def test_a_newer_version_asks_for_an_upgrade() -> None:
    body = {"kind": KIND, "version": 2, "x": 1}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    data = b'{"crc32c":%d,%s' % (crc32c_of([canonical]), canonical[1:])
    with pytest.raises(CorruptCheckpointError, match="upgrade ckptstore"):
        decode(data)


def test_the_checksum_does_not_depend_on_key_order() -> None:
    data = encode_document(KIND, {"b": 1, "a": 2})
    document = json.loads(data)
    reordered = json.dumps(dict(reversed(list(document.items())))).encode()
    assert decode(reordered)["a"] == 2


@pytest.mark.parametrize(
    "data",
    [
        b"[" * 100_000 + b"]" * 100_000,  # RecursionError in json.loads without the check
        b'{"a":' + b"9" * 5000 + b"}",  # ValueError: too many digits for int()
        b'{"a":NaN}',
        b'{"a":Infinity}',
        b"\xff\xfe",
    ],
    ids=["deep", "huge-integer", "nan", "infinity", "not-utf8"],
)
def test_untrusted_json_fails_as_corrupt_checkpoint(data: bytes) -> None:
    with pytest.raises(CorruptCheckpointError):
        decode_document(data, "ckptstore.commit", url="/ckpt", key="k")


def test_document_size_and_depth_limits_are_configurable() -> None:
    data = encode_document("ckptstore.commit", {"nested": [[[1]]]})
    try:
        set_limits(Limits(max_json_depth=3))
        with pytest.raises(CorruptCheckpointError, match="nested 4 levels deep"):
            decode_document(data, "ckptstore.commit", url="/ckpt", key="k")
        set_limits(Limits(max_document_bytes=len(data) - 1))
        with pytest.raises(CorruptCheckpointError, match="more than the limit"):
            decode_document(data, "ckptstore.commit", url="/ckpt", key="k")
    finally:
        set_limits(None)
    assert decode_document(data, "ckptstore.commit", url="/ckpt", key="k")["nested"] == [[[1]]]


def test_a_document_of_too_many_values_is_refused_before_any_is_built() -> None:
    """A million empty arrays (3 MB of JSON) would take ~60 MB parsed: the values are
    counted on the bytes first, so nothing is built (and the limit's variable named)."""
    data = encode_document("ckptstore.commit", {"pad": [[]] * 1_000_000})
    try:
        set_limits(Limits(max_json_values=100_000))
        tracemalloc.start()
        with pytest.raises(CorruptCheckpointError, match="CKPTSTORE_LIMIT_MAX_JSON_VALUES"):
            decode_document(data, "ckptstore.commit", url="/ckpt", key="k")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        set_limits(None)
    assert peak < 1 << 20
    assert len(decode_document(data, "ckptstore.commit", url="/ckpt", key="k")["pad"]) == 10**6


@pytest.mark.parametrize(
    "text",
    ["[[[[[[", '\\"{{{{', "]]]]", 'a\\\\"[[[['],
    ids=["plain", "escaped", "closing", "slash"],
)
def test_brackets_inside_strings_do_not_count_as_nesting(text: str) -> None:
    data = encode_document("ckptstore.commit", {"s": text, "list": [[1]]})
    try:
        set_limits(Limits(max_json_depth=3))
        assert decode_document(data, "ckptstore.commit", url="/ckpt", key="k")["s"] == text
        deeper = encode_document("ckptstore.commit", {"s": text, "list": [[[1]]]})
        with pytest.raises(CorruptCheckpointError, match="nested 4 levels deep"):
            decode_document(deeper, "ckptstore.commit", url="/ckpt", key="k")
    finally:
        set_limits(None)


def test_a_document_differing_from_its_checksum_by_one_byte_is_refused_either_way() -> None:
    data = encode_document(KIND, {"epoch": 3, "note": "abc"})
    assert decode(data)["note"] == "abc"
    with pytest.raises(CorruptCheckpointError, match="CRC-32C"):
        decode(data.replace(b'"abc"', b'"abd"'))
    reformatted = json.dumps(json.loads(data), indent=1).encode()  # canonical check path
    assert decode(reformatted)["note"] == "abc"
    with pytest.raises(CorruptCheckpointError, match="CRC-32C"):
        decode(reformatted.replace(b'"abc"', b'"abd"'))


def test_canonical_form_is_the_standard_librarys() -> None:
    """orjson writes the documents; the bytes are still those of ``json.dumps`` with
    sorted keys (non-ASCII text and integers beyond 64 bits take json.dumps itself)."""
    bodies = [
        {"b": [1, 2**63, None, True], "a": {"z": 'x\n\t\x01/\\"', "y": 1.5}},
        {"text": "é\x7f", "big": -(2**70)},
    ]
    for body in bodies:
        document = {"kind": KIND, "version": 1, **body}
        canonical = json.dumps(document, sort_keys=True, separators=(",", ":")).encode()
        data = encode_document(KIND, body)
        assert data == b'{"crc32c":%d,%s' % (crc32c_of([canonical]), canonical[1:])
        assert decode(data) == document


def test_documents_written_by_the_standard_library_still_decode() -> None:
    """Every document before orjson was ``json.dumps``' canonical JSON; floats it spells
    otherwise than orjson (``1e-05``) still pass, also reformatted (the canonical check)."""
    body = {"kind": KIND, "version": 1, "tiny": 1e-05, "huge": 1e22, "name": "ü"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    data = b'{"crc32c":%d,%s' % (crc32c_of([canonical]), canonical[1:])
    assert decode(data) == body
    reformatted = json.dumps(json.loads(data), indent=2).encode()
    assert decode(reformatted) == body
    with pytest.raises(CorruptCheckpointError, match="CRC-32C"):
        decode(reformatted.replace(b"1e-05", b"2e-05"))


# -- gzip-compressed documents (large manifests are stored so) ----------------------------


@contextlib.contextmanager
def document_limit(nbytes: int) -> Iterator[None]:
    """Within: ``Limits.max_document_bytes`` is ``nbytes``."""
    set_limits(replace(current_limits(), max_document_bytes=nbytes))
    try:
        yield
    finally:
        set_limits(None)


def test_a_gzip_compressed_document_decodes_as_its_json() -> None:
    data = commit_document()
    compressed = gzip_document(data)
    assert compressed.startswith(GZIP_MAGIC)
    assert gzip.decompress(compressed) == data  # plain gzip: zcat shows it
    assert decode(compressed, "ckptstore.commit") == decode(data, "ckptstore.commit")
    assert gzip_document(data) == compressed  # deterministic: no time in the header
    # another compressor's header (a file name, a time, another OS) is gzip all the same
    assert decode(gzip.compress(data, mtime=1), "ckptstore.commit")["epoch"] == 4


def test_the_json_checks_apply_to_the_decompressed_document() -> None:
    damaged = commit_document().replace(b'"epoch":4', b'"epoch":5')
    with pytest.raises(CorruptCheckpointError, match="CRC-32C"):
        decode(gzip_document(damaged), "ckptstore.commit")
    with pytest.raises(CorruptCheckpointError, match=r"expected a 'ckptstore\.manifest'"):
        decode(gzip_document(commit_document()), "ckptstore.manifest")
    deep = gzip_document(b"[" * 100_000 + b"]" * 100_000)
    with pytest.raises(CorruptCheckpointError, match="levels deep"):
        decode(deep, "ckptstore.commit")


def test_the_document_limit_bounds_the_decompressed_json() -> None:
    data = commit_document()
    compressed = gzip_document(data)
    assert len(compressed) < len(data)
    with document_limit(len(data)):
        assert decode(compressed, "ckptstore.commit")["epoch"] == 4
    with (
        document_limit(len(data) - 1),
        pytest.raises(CorruptCheckpointError, match="decompresses to more than the limit"),
    ):
        decode(compressed, "ckptstore.commit")


@pytest.mark.parametrize("nbytes", [8 << 20, 200 << 20])
def test_a_gzip_bomb_is_refused_without_decompressing_beyond_the_limit(nbytes: int) -> None:
    """A valid document padded with spaces to ``nbytes``, in a few hundred KB of gzip:
    with the limit above its size it decodes (nothing but the bound stops it); below,
    it is refused once the output passes the limit, having allocated about the limit
    (never ``nbytes``)."""
    limit = 1 << 20
    bomb = gzip_bomb(commit_document(), nbytes)
    assert len(bomb) < nbytes // 500
    if nbytes <= 8 << 20:
        with document_limit(nbytes):
            assert decode(bomb, "ckptstore.commit")["epoch"] == 4
    with document_limit(limit):
        tracemalloc.start()
        try:
            with pytest.raises(CorruptCheckpointError, match=f"more than the limit of {limit}"):
                decode(bomb, "ckptstore.commit")
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert peak < 3 * limit


def damaged_gzip() -> dict[str, bytes]:
    """One gzip-compressed document, broken in each way the decoder must refuse."""
    compressed = gzip_document(commit_document())
    flipped = bytearray(compressed)
    flipped[len(compressed) // 2] ^= 0x01  # inside the deflate stream
    trailer = bytearray(compressed)
    trailer[-6] ^= 0x01  # the CRC-32 of the decompressed bytes
    return {
        "truncated": compressed[:-4],
        "header only": compressed[:10],
        "magic only": GZIP_MAGIC,
        "trailing garbage": compressed + b"\n",
        "trailing zeros": compressed + bytes(8),
        "two members": compressed + compressed,
        "flipped deflate byte": bytes(flipped),
        "flipped crc": bytes(trailer),
        "wrong length": compressed[:-4] + struct.pack("<I", len(commit_document()) + 1),
        "not deflate": compressed[:2] + b"\x07" + compressed[3:],
        "reserved flags": compressed[:3] + b"\xe0" + compressed[4:],
        "zlib, not gzip": GZIP_MAGIC + zlib.compress(commit_document()),
    }


@pytest.mark.parametrize("case", sorted(damaged_gzip()))
def test_a_damaged_gzip_stream_is_refused_as_corrupt(case: str) -> None:
    with pytest.raises(CorruptCheckpointError, match="gzip-compressed document") as info:
        decode(damaged_gzip()[case], "ckptstore.commit")
    assert info.value.file == "doc.json"
    assert "\n" not in str(info.value)


def test_every_flipped_bit_of_a_compressed_document_is_detected() -> None:
    """Every flipped bit of a gzip-compressed document is refused, but for the few that
    change no byte of the document: the header's fields nothing reads (its text flag,
    time, compression level and OS) and the padding bits after the last deflate block.
    Those leave the content intact, never misread; on a manifest, the commit record's
    CRC-32C of the stored bytes covers them too."""
    data = gzip_document(DOCUMENTS["ckptstore.manifest"]())
    expected = decode(data, "ckptstore.manifest")
    unread = {3, 4, 5, 6, 7, 8, 9, len(data) - 9}  # offsets; the trailer is 8 bytes
    undetected = [
        (offset, bit)
        for offset, bit, decoded in flips_decoded(data, "ckptstore.manifest")
        if offset not in unread or decoded != expected
    ]
    assert undetected == []
