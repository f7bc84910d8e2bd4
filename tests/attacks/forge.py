"""Forging stored bytes the way an attacker who controls the checkpoint prefix can:
any byte, with checksums recomputed so they match (see docs/security.md), and a
watch on a directory outside the prefix that sees every access to it."""

from __future__ import annotations

import ctypes
import json
import os
import zlib
from pathlib import Path
from typing import Any

from ckptstore.io._checksum import checksum_of, crc32c_of
from ckptstore.records._layout import MANIFEST_NAME, node_commit_key, node_data_key

NODE = "trainer_0"
EPOCH = 2


def canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def signed(canonical_body: bytes) -> bytes:
    """A control document with a valid CRC-32C over ``canonical_body`` (``{...}``)."""
    return b'{"crc32c":%d,%s' % (crc32c_of([canonical_body]), canonical_body[1:])


def _attempt_of(root: Path, node: str, epoch: int) -> str | None:
    """The attempt directory of ``node``'s checkpoint of ``epoch`` (the run holds one
    save of it: its record may be forged already, so the directory is looked up);
    ``None`` for a checkpoint of an earlier version, without one."""
    attempts = sorted((root / f"{node}.{epoch}").glob("attempt-*"))
    assert len(attempts) <= 1, attempts
    return attempts[0].name.split("-", 1)[1] if attempts else None


class Forge:
    """One node checkpoint of a run under ``root``, edited in place with valid CRCs."""

    def __init__(self, root: Path, node: str = NODE, epoch: int = EPOCH) -> None:
        self.root, self.node, self.epoch = root, node, epoch
        self.commit_path = root / node_commit_key(epoch, node)  # this node's commit record
        self.db = root / node_data_key(node, epoch, _attempt_of(root, node, epoch))
        self.manifest_path = self.db / MANIFEST_NAME

    def manifest(self) -> dict[str, Any]:
        document: dict[str, Any] = json.loads(self.manifest_path.read_bytes())
        document.pop("crc32c")
        return document

    def commit(self) -> dict[str, Any]:
        document: dict[str, Any] = json.loads(self.commit_path.read_bytes())
        document.pop("crc32c")
        return document

    def write_commit_bytes(self, data: bytes) -> None:
        self.commit_path.write_bytes(data)

    def write_commit(self, body: dict[str, Any]) -> None:
        self.write_commit_bytes(signed(canonical(body)))

    def write_manifest_bytes(self, data: bytes) -> None:
        """Replace the manifest and make the commit record vouch for it."""
        self.manifest_path.write_bytes(data)
        commit = self.commit()
        commit["manifest_crc32c"] = crc32c_of([data])
        self.write_commit(commit)

    def write_manifest(self, body: dict[str, Any]) -> None:
        self.write_manifest_bytes(signed(canonical(body)))

    def blob(self, name: str | None = None) -> tuple[str, dict[str, Any]]:
        """A blob of the node (default: its largest) and its manifest record."""
        blobs = self.manifest()["blobs"]
        name = name or max(blobs, key=lambda n: sum(c[2] for c in blobs[n]["chunks"]))
        return name, blobs[name]

    def data_file(self, name: str | None = None) -> Path:
        """The stored file holding the first chunk of a blob."""
        return self.db / self.blob(name)[1]["chunks"][0][0]

    def recorded_crcs(self) -> set[int]:
        """Every checksum recorded for this node (none may appear in an error)."""
        manifest = self.manifest()
        crcs = {chunk[4] for record in manifest["blobs"].values() for chunk in record["chunks"]}
        crcs |= {chunk[4] for chunk in manifest["files"]}
        crcs.add(self.commit()["manifest_crc32c"])
        return crcs

    def resign_chunks(self, name: str) -> None:
        """Recompute the checksum of every chunk of blob ``name`` from the stored bytes
        (after forging them), so checksums match the forgery."""
        body = self.manifest()
        for chunk in body["blobs"][name]["chunks"]:
            data = (self.db / chunk[0]).read_bytes()[chunk[1] : chunk[1] + chunk[2]]
            chunk[4] = chunk_checksum(body, data)
        self.write_manifest(body)

    def resign_all(self) -> None:
        """Recompute every checksum the manifest records (blob chunks and format
        ranges) from the stored bytes, after forging them in place."""
        body = self.manifest()
        records = [c for r in body["blobs"].values() for c in r["chunks"]] + body["files"]
        for chunk in records:
            data = (self.db / chunk[0]).read_bytes()[chunk[1] : chunk[1] + chunk[2]]
            chunk[4] = chunk_checksum(body, data)
        self.write_manifest(body)


def gzip_bomb(document: bytes, nbytes: int) -> bytes:
    """One valid gzip member of ``document`` followed by spaces (JSON whitespace) up to
    ``nbytes``: 200 MiB take ~200 KB. Decompressed whole, it is ``document`` still
    (its checksum holds, as the canonical form): only a bound on decompression keeps a
    reader from allocating ``nbytes``."""
    compressor = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    parts = [compressor.compress(document)]
    spaces = b" " * (1 << 20)
    remaining = nbytes - len(document)
    while remaining > 0:
        parts.append(compressor.compress(spaces[: min(remaining, len(spaces))]))
        remaining -= len(spaces)
    parts.append(compressor.flush())
    return b"".join(parts)


def chunk_checksum(manifest: dict[str, Any], data: bytes) -> int:
    """The checksum of ``data`` by the algorithm ``manifest`` (a manifest's JSON) names."""
    return checksum_of(manifest.get("checksum", "crc32c"))([data])


# -- a watch on the outside of the prefix ------------------------------------------------

_IN_ALL_EVENTS = 0xFFF  # access, modify, attrib, close, open, move, create, delete


class OutsideWatch:
    """inotify on a directory outside the prefix (and each file in it): every open,
    read, write, create or delete there, through any path or link, is an event."""

    def __init__(self, directory: Path) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        assert self._fd >= 0, os.strerror(ctypes.get_errno())
        for path in [directory, *sorted(directory.rglob("*"))]:
            if path.is_symlink():
                continue
            assert self._libc.inotify_add_watch(self._fd, os.fsencode(path), _IN_ALL_EVENTS) >= 0

    def events(self) -> int:
        """Bytes of events seen since the last call (0: nothing touched)."""
        total = 0
        while True:
            try:
                total += len(os.read(self._fd, 1 << 16))
            except BlockingIOError:
                return total

    def close(self) -> None:
        os.close(self._fd)
