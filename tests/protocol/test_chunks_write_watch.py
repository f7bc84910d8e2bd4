"""Incremental saves that do not read memory the kernel saw no write to
(``ckptstore/protocol/_chunks.py`` with ``ckptstore/io/_write_watch.py``)."""

from __future__ import annotations

import mmap
import resource
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ckptstore.builtin import LocalPath, ZarrDB
from ckptstore.errors import JobConfigurationError
from ckptstore.io import WRITE_WATCH_ENV, Look, ParallelIO, WriteWatch
from ckptstore.protocol import _chunks, commit_epoch, write_node
from ckptstore.protocol._commit import open_node, read_blobs

Array = np.ndarray[Any, Any]
MiB = 1 << 20
CHUNK = _chunks.CHUNK_BYTES


def save(root: Path, epoch: int, blobs: dict[str, Array]) -> None:
    storage = LocalPath(str(root))
    commit = write_node(storage, "t", epoch, blobs, ZarrDB(), ParallelIO(), incremental=True)
    commit_epoch(storage, epoch, [commit])


def load(root: Path, epoch: int) -> dict[str, Array]:
    storage = LocalPath(str(root))
    return read_blobs(storage, open_node(storage, "t", epoch), None, ZarrDB(), ParallelIO())


def own_pages(values: Array) -> Array:
    """``values`` in memory of its own: on the heap, the allocator writes its records
    into the pages a blob shares with its neighbours, so its end chunks may be read."""
    memory = mmap.mmap(-1, values.nbytes, flags=mmap.MAP_PRIVATE)
    array = np.frombuffer(memory, values.dtype)
    array[:] = values
    return array


def state() -> dict[str, Array]:
    rng = np.random.default_rng(3)
    return {
        "base": own_pages(rng.standard_normal(4 * CHUNK // 4).astype(np.float32)),  # 4 chunks
        "head": own_pages(rng.standard_normal(CHUNK // 4).astype(np.float32)),  # 1 chunk
    }


@pytest.mark.usefixtures("write_watched")
def test_a_save_reads_only_the_chunks_written_since_the_previous_one(
    tmp_path: Path, hashed: list[int]
) -> None:
    blobs = state()
    save(tmp_path, 0, blobs)
    assert len(hashed) == 5
    before = {name: array.copy() for name, array in blobs.items()}
    blobs["head"] += 1.0
    blobs["base"][2 * CHUNK // 4 + CHUNK // 8] = 7.0  # mid-way through the third chunk
    hashed.clear()
    save(tmp_path, 1, blobs)
    assert len(hashed) == 2 + 1  # the two written chunks, and one unwritten as a check
    hashed.clear()
    save(tmp_path, 2, blobs)
    assert len(hashed) == 1  # nothing written: only the check
    for epoch, expected in ((0, before), (1, blobs), (2, blobs)):
        got = load(tmp_path, epoch)
        for name, array in expected.items():
            np.testing.assert_array_equal(got[name], array)


@pytest.mark.usefixtures("write_watched")
def test_a_save_that_failed_after_looking_makes_the_next_read_everything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hashed: list[int]
) -> None:
    blobs = state()
    save(tmp_path, 0, blobs)
    blobs["base"][0] = 42.0  # seen by the failed save's look, which is then lost
    real = _chunks.ChunkStore._announce
    monkeypatch.setattr(_chunks.ChunkStore, "_announce", lambda self, names: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        save(tmp_path, 1, blobs)
    monkeypatch.setattr(_chunks.ChunkStore, "_announce", real)
    hashed.clear()
    save(tmp_path, 2, blobs)
    assert len(hashed) == 5
    assert load(tmp_path, 2)["base"][0] == 42.0


@pytest.mark.usefixtures("write_watched")
def test_roots_saving_the_same_memory_each_see_every_write(tmp_path: Path) -> None:
    blobs = state()
    first, second = tmp_path / "a", tmp_path / "b"
    save(first, 0, blobs)
    save(second, 0, blobs)
    blobs["base"][5] = -1.0
    save(first, 1, blobs)  # its look protects the page again
    save(second, 1, blobs)
    assert load(first, 1)["base"][5] == -1.0
    assert load(second, 1)["base"][5] == -1.0


class Blind(WriteWatch):
    """A watch that sees no write after the first look (a device writing into pinned
    memory, as the kernel would miss it)."""

    disabled: list[str] = []

    def look(self, consumer: Any, address: int, nbytes: int, stamp: int) -> Look:
        pages = -(-(address % 4096 + nbytes) // 4096)
        return Look(1, np.zeros(pages, np.bool_) if stamp else None, address % 4096)

    def disable(self, why: str) -> None:
        self.disabled.append(why)


def test_a_change_the_kernel_did_not_see_is_caught_and_the_save_reads_every_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    blind = Blind()
    monkeypatch.setattr(_chunks, "write_watch", lambda: blind)
    blobs = {"only": np.ones(CHUNK // 4, np.float32)}  # one chunk: the one checked
    save(tmp_path, 0, blobs)
    blobs["only"][3] = 3.0  # unseen by the blind watch
    save(tmp_path, 1, blobs)
    assert load(tmp_path, 1)["only"][3] == 3.0
    assert blind.disabled == ["blob 'only' of node 't'"]


def test_an_unseen_change_to_a_chunk_to_write_again_fails_the_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blind = Blind()
    monkeypatch.setattr(_chunks, "write_watch", lambda: blind)
    blobs = {"a": np.ones(CHUNK // 4, np.float32), "b": np.zeros(CHUNK // 4, np.float32)}
    save(tmp_path, 0, blobs)
    storage = LocalPath(str(tmp_path))
    keys = storage.list_keys(_chunks.CHUNK_STORE_DIR)
    storage.delete(keys)  # gone: both must be written again, from memory
    blobs["b"][0] = 5.0  # the check of this save reads "a", unchanged
    with pytest.raises(JobConfigurationError, match="without a write the kernel saw"):
        save(tmp_path, 1, blobs)
    assert blind.disabled


@pytest.mark.usefixtures("write_watched")
def test_memory_written_all_over_at_each_save_is_let_go(tmp_path: Path) -> None:
    """A write to watched memory costs a page fault per page after each save; memory
    written all over since the previous save (changed, or copied into again with the
    same bytes, as a staging buffer is) is let go: its writes cost none, and every 8th
    save looks again."""
    values = np.random.default_rng(4).standard_normal(CHUNK // 4).astype(np.float32)
    blobs = {
        "dense": own_pages(np.ones(2 * CHUNK // 4, np.float32)),
        "copied": own_pages(values),
        "kept": own_pages(np.ones(2 * CHUNK // 4, np.float32)),
    }
    save(tmp_path, 0, blobs)
    blobs["dense"] += 1.0
    np.copyto(blobs["copied"], values)
    save(tmp_path, 1, blobs)
    remembered = _chunks._MEMORY[(LocalPath(str(tmp_path)).display_url, "t")]
    assert [remembered[name].unwatched for name in blobs] == [1, 1, 0]
    assert [bool(remembered[name].stamp) for name in blobs] == [False, False, True]
    faults = []
    for name in blobs:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        if name == "copied":
            np.copyto(blobs[name], values)
        else:
            blobs[name] += 1.0
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    pages = CHUNK // mmap.PAGESIZE
    assert faults[0] < pages // 4  # no longer protected
    assert faults[1] < pages // 8
    assert faults[2] >= pages  # still watched: a fault per page
    stamps = []
    for epoch in range(2, 2 + _chunks.PROBE_EVERY):
        np.copyto(blobs["copied"], values)
        save(tmp_path, epoch, blobs)
        remembered = _chunks._MEMORY[(LocalPath(str(tmp_path)).display_url, "t")]
        stamps.append(bool(remembered["copied"].stamp))
    assert stamps == [False] * (_chunks.PROBE_EVERY - 1) + [True]  # the 8th looks again


def test_with_the_watch_off_every_chunk_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hashed: list[int]
) -> None:
    """What every save does where the kernel cannot watch (and what it did before)."""
    monkeypatch.setenv(WRITE_WATCH_ENV, "off")
    blobs = state()
    save(tmp_path, 0, blobs)
    blobs["base"][0] = 2.0
    hashed.clear()
    save(tmp_path, 1, blobs)
    assert len(hashed) == 5
    assert load(tmp_path, 1)["base"][0] == 2.0
