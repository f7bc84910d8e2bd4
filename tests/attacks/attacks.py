"""The named attacks: each forges one thing in epoch 2 of ``trainer_0`` of a run (an
attacker controls every byte under the prefix, checksums included) and says what a
clean failure looks like. Used by ``test_attacks.py``."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numcodecs
import numpy as np

from ckptstore.records._layout import CONTROL_DIR
from tests.attacks.forge import EPOCH, Forge, canonical, gzip_bomb, signed

Attack = Callable[[Forge, Path], None]
ALL_FORMATS = ("zarr", "npz", "lmdb")


@dataclass(frozen=True)
class Spec:
    """An attack and the formats it applies to; ``in_manifest``: visible to ``inspect``
    (which reads manifests only); ``whole_run``: no intact epoch is left to fall back
    to; ``reads_inode``: a hard link, whose target is read as stored bytes."""

    attack: Attack
    formats: tuple[str, ...] = ("zarr",)
    in_manifest: bool = False
    whole_run: bool = False
    reads_inode: bool = False


def _move_out(path: Path, outside: Path) -> None:
    """Move ``path`` outside the prefix and leave a symbolic link in its place."""
    target = outside / f"moved-{path.name}"
    shutil.move(path, target)
    os.symlink(target, path)


def symlinked_blob_file(forge: Forge, outside: Path) -> None:
    _move_out(forge.data_file(), outside)  # same bytes: every CRC still matches


def symlinked_node_dir(forge: Forge, outside: Path) -> None:
    _move_out(forge.db, outside)


def symlinked_control_dir(forge: Forge, outside: Path) -> None:
    _move_out(forge.root / CONTROL_DIR, outside)


def symlinked_manifest(forge: Forge, outside: Path) -> None:
    _move_out(forge.manifest_path, outside)


def hardlinked_blob_file(forge: Forge, outside: Path) -> None:
    target = forge.data_file()
    target.unlink()
    os.link(outside / "secret", target)


def fifo_blob_file(forge: Forge, outside: Path) -> None:
    target = forge.data_file()
    target.unlink()
    os.mkfifo(target)


def truncated_blob_file(forge: Forge, outside: Path) -> None:
    target = forge.data_file()
    os.truncate(target, target.stat().st_size // 2)


def _edit_chunk(forge: Forge, field: int, value: object, *, shape: object = None) -> None:
    body = forge.manifest()
    name, _ = forge.blob()
    body["blobs"][name]["chunks"][0][field] = value
    if shape is not None:
        body["blobs"][name]["shape"] = shape
    forge.write_manifest(body)


def shape_10e12(forge: Forge, outside: Path) -> None:
    # 10^12 float32 elements (3.6 TiB) supplied by one chunk said to be that long
    _edit_chunk(forge, 3, 4 * 10**12, shape=[10**12])
    body = forge.manifest()
    name, _ = forge.blob()
    body["blobs"][name]["chunks"][0][2] = 4 * 10**12
    forge.write_manifest(body)


def offset_2_64(forge: Forge, outside: Path) -> None:
    _edit_chunk(forge, 1, 2**64)


def offset_beyond_file(forge: Forge, outside: Path) -> None:
    _edit_chunk(forge, 1, forge.data_file().stat().st_size)


def negative_size(forge: Forge, outside: Path) -> None:
    _edit_chunk(forge, 3, -1)


def traversal_chunk_key(forge: Forge, outside: Path) -> None:
    _edit_chunk(forge, 0, "../../outside/secret")


def absolute_chunk_key(forge: Forge, outside: Path) -> None:
    _edit_chunk(forge, 0, str(outside / "secret"))


def object_dtype(forge: Forge, outside: Path) -> None:
    body = forge.manifest()
    name, _ = forge.blob()
    body["blobs"][name]["dtype"] = "|O"
    forge.write_manifest(body)


def unknown_codec(forge: Forge, outside: Path) -> None:
    # no reader decodes it: corrupt (a resume falls back), not an unsupported *value*
    body = forge.manifest()
    name, _ = forge.blob()
    body["blobs"][name]["codec"] = "rot13"
    forge.write_manifest(body)


def wrong_types(forge: Forge, outside: Path) -> None:
    body = forge.manifest()
    name, _ = forge.blob()
    body["blobs"][name]["shape"] = "[64]"
    body["blobs"][name]["chunks"] = {"0": body["blobs"][name]["chunks"]}
    forge.write_manifest(body)


def traversal_blob_name(forge: Forge, outside: Path) -> None:
    body = forge.manifest()
    name, _ = forge.blob()
    body["blobs"]["../../outside/\u202esecret\x00"] = body["blobs"].pop(name)
    forge.write_manifest(body)


def deep_json_manifest(forge: Forge, outside: Path) -> None:
    depth = 100_000
    body = canonical(forge.manifest())
    forge.write_manifest_bytes(signed(b'{"a":' + b"[" * depth + b"]" * depth + b"," + body[1:]))


def oversized_manifest(forge: Forge, outside: Path) -> None:
    forge.write_manifest_bytes(forge.manifest_path.read_bytes())
    os.truncate(forge.manifest_path, 1 << 30)  # sparse: 1 GiB on paper


def gzip_bomb_manifest(forge: Forge, outside: Path) -> None:
    # the intact manifest, gzip-compressed with 200 MiB of spaces after it (~200 KB): a
    # reader that decompressed it whole would hold 200 MiB, three times the default
    # document limit, before refusing it
    forge.write_manifest_bytes(gzip_bomb(forge.manifest_path.read_bytes(), 200 << 20))


def many_values_manifest(forge: Forge, outside: Path) -> None:
    # 9 MB of valid JSON (3 million empty arrays) that parses to ~190 MB of Python
    # objects: the byte limit lets it through, the count of JSON values does not
    body = forge.manifest()
    body["pad"] = [[]] * 3_000_000
    forge.write_manifest(body)


def manifest_of_other_node(forge: Forge, outside: Path) -> None:
    other = Forge(forge.root, "trainer_1", forge.epoch)
    forge.write_manifest_bytes(other.manifest_path.read_bytes())


def deep_json_commit(forge: Forge, outside: Path) -> None:
    depth = 100_000
    body = canonical(forge.commit())
    forge.write_commit_bytes(signed(b'{"a":' + b"[" * depth + b"]" * depth + b"," + body[1:]))


def huge_integer_commit(forge: Forge, outside: Path) -> None:
    body = forge.commit()
    body["nbytes"] = -7
    text = canonical(body).replace(b'"nbytes":-7', b'"nbytes":' + b"9" * 5000)
    forge.write_commit_bytes(signed(text))


def float_fields_commit(forge: Forge, outside: Path) -> None:
    body = forge.commit()
    body["nbytes"] = 1e308
    body["nblobs"] = True
    forge.write_commit(body)


def traversal_node_name(forge: Forge, outside: Path) -> None:
    body = forge.commit()
    body["node"] = "../outside/secret"
    forge.write_commit(body)


def commit_of_other_epoch(forge: Forge, outside: Path) -> None:
    older = Forge(forge.root, forge.node, EPOCH - 1)
    forge.write_commit_bytes(older.commit_path.read_bytes())


def replace_chunk(forge: Forge, data: bytes, *, declared: int | None = None) -> None:
    """Replace the first chunk of the node's largest blob (a file of its own) with
    ``data``, whole: its stored size and checksum say so (a stored size left as it was
    would cut the frame short, and a cut frame fails to decode whatever the bound).
    With ``declared``, the manifest also says the chunk decodes to that many bytes
    (shape to match); without, it still says the chunk's original 256 bytes."""
    name, _ = forge.blob()
    forge.data_file(name).write_bytes(data)
    body = forge.manifest()
    chunk = body["blobs"][name]["chunks"][0]
    assert chunk[1] == 0  # the chunk is its own file
    chunk[2] = len(data)
    if declared is not None:
        chunk[3] = declared
        body["blobs"][name]["shape"] = [declared // 4]
        body["blobs"][name]["layout"]["chunk_shape"] = [declared // 4]
    forge.write_manifest(body)
    forge.resign_chunks(name)


def _zstd_frame_declaring(nbytes: int) -> bytes:
    """A small zstd frame of zeros whose header declares ``nbytes`` of content."""
    frame = bytearray(numcodecs.Zstd(level=19).encode(np.zeros(1 << 20, np.uint8)))
    descriptor = frame[4]
    assert descriptor >> 6 == 2  # a 4-byte content size
    assert descriptor & 0x20  # in a single segment
    frame[5:9] = nbytes.to_bytes(4, "little")
    return bytes(frame)


def zstd_bomb_declared(forge: Forge, outside: Path) -> None:
    # 4 KB -> 1 GiB, the manifest agreeing with the frame's header: more than
    # Limits.max_compression_ratio (2^17) allows, refused when the manifest is decoded
    frame = _zstd_frame_declaring(1 << 30)
    replace_chunk(forge, frame + bytes(4096 - len(frame)), declared=1 << 30)


ATTACKS: dict[str, Spec] = {
    "symlinked_blob_file": Spec(symlinked_blob_file, ALL_FORMATS),
    "symlinked_node_dir": Spec(symlinked_node_dir, in_manifest=True),
    "symlinked_control_dir": Spec(symlinked_control_dir, in_manifest=True, whole_run=True),
    "symlinked_manifest": Spec(symlinked_manifest, in_manifest=True),
    "hardlinked_blob_file": Spec(hardlinked_blob_file, ALL_FORMATS, reads_inode=True),
    "fifo_blob_file": Spec(fifo_blob_file, ALL_FORMATS),
    "truncated_blob_file": Spec(truncated_blob_file, ALL_FORMATS),
    "shape_10e12": Spec(shape_10e12, ALL_FORMATS),
    "offset_2_64": Spec(offset_2_64, in_manifest=True),
    "offset_beyond_file": Spec(offset_beyond_file, ALL_FORMATS),
    "negative_size": Spec(negative_size, in_manifest=True),
    "traversal_chunk_key": Spec(traversal_chunk_key, in_manifest=True),
    "absolute_chunk_key": Spec(absolute_chunk_key, in_manifest=True),
    "object_dtype": Spec(object_dtype, in_manifest=True),
    "unknown_codec": Spec(unknown_codec, ("zarr", "zarr-zstd")),
    "wrong_types": Spec(wrong_types, in_manifest=True),
    "traversal_blob_name": Spec(traversal_blob_name, in_manifest=True),
    "deep_json_manifest": Spec(deep_json_manifest, in_manifest=True),
    "oversized_manifest": Spec(oversized_manifest, in_manifest=True),
    "gzip_bomb_manifest": Spec(gzip_bomb_manifest, in_manifest=True),
    "many_values_manifest": Spec(many_values_manifest, in_manifest=True),
    "manifest_of_other_node": Spec(manifest_of_other_node, in_manifest=True),
    "deep_json_commit": Spec(deep_json_commit, in_manifest=True),
    "huge_integer_commit": Spec(huge_integer_commit, in_manifest=True),
    "float_fields_commit": Spec(float_fields_commit, in_manifest=True),
    "traversal_node_name": Spec(traversal_node_name, in_manifest=True),
    "commit_of_other_epoch": Spec(commit_of_other_epoch, in_manifest=True),
    "zstd_bomb_declared": Spec(zstd_bomb_declared, ("zarr-zstd",), in_manifest=True),
}
