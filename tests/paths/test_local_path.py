"""The ``local`` path type, on real files."""

from __future__ import annotations

import errno
import fcntl
import os
import pickle
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ckpt_helpers import file_permissions_enforced, files_under, recorded_fsyncs

from ckptstore import CheckpointManager, CorruptCheckpointError, StorageError
from ckptstore.errors import KeyExistsError, ObjectNotFoundError, is_permanent
from ckptstore.io import usable_cpus
from ckptstore.io._direct import DIRECT_ALIGN, DIRECT_FROM, memory_residue
from ckptstore.paths import LocalPath, _file_io, _local_path
from ckptstore.paths._file_io import EARLY_WRITEBACK_BYTES, _advance, _write_vectored
from ckptstore.paths._local_path import DURABILITY_MODES
from ckptstore.plugin._registry import Registry
from ckptstore.protocol import committed_epochs


def test_round_trip_of_parts_and_ranges(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    array = np.arange(10, dtype=np.int32)
    storage.write_parts("a/b/c", [b"head", array, memoryview(b"tail")])
    expected = b"head" + array.tobytes() + b"tail"
    assert (tmp_path / "a" / "b" / "c").read_bytes() == expected
    assert storage.read_bytes("a/b/c") == expected
    assert storage.read_bytes("a/b/c", 4, 8) == array[:2].tobytes()
    assert storage.size("a/b/c") == len(expected)
    first, second = bytearray(3), np.zeros(2, dtype=np.int32)
    storage.read_into("a/b/c", 2, [memoryview(first), second.data])
    assert bytes(first) == b"ad\x00"
    assert second.tobytes() == expected[5:13]
    whole = np.zeros(10, dtype=np.int32)  # one view, not of bytes: one system call
    storage.read_into("a/b/c", 4, [memoryview(whole)])
    assert (whole == array).all()


def test_writes_of_many_parts(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    parts = [bytes([i % 256]) * 3 for i in range(1500)]  # more than one writev batch
    storage.write_parts("many", parts)
    assert storage.read_bytes("many") == b"".join(parts)
    targets = [memoryview(bytearray(3)) for _ in range(1500)]
    storage.read_into("many", 0, targets)
    assert b"".join(bytes(t) for t in targets) == b"".join(parts)


def test_a_rewrite_truncates(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    storage.write_bytes("k", b"long content")
    storage.write_bytes("k", b"short")
    assert storage.read_bytes("k") == b"short"


def test_short_vectored_writes_resume_where_they_stopped() -> None:
    written = bytearray()

    def write_at_most_5(batch: list[memoryview]) -> int:
        chunk = b"".join(bytes(view) for view in batch)[:5]
        written.extend(chunk)
        return len(chunk)

    parts = [b"abc", b"", b"defghij", b"k", b"lmnopqrstu"]
    views = [memoryview(part) for part in parts]
    assert _write_vectored(views, write_at_most_5) == 21
    assert bytes(written) == b"".join(parts)


def test_a_short_read_resumes_inside_a_view_of_any_format() -> None:
    words = np.arange(4, dtype=np.int32)
    views = [memoryview(bytearray(2)), memoryview(words)]
    _advance(views, 2 + 6)  # a read that stopped in the middle of the second word
    assert len(views) == 1
    assert views[0].nbytes == 10  # cut as bytes, not as words
    assert views[0].tobytes() == words.tobytes()[6:]


def test_a_large_aligned_read_of_a_file_out_of_the_cache_goes_direct(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    data = np.random.default_rng(0).integers(0, 255, 2 * DIRECT_FROM + 100, dtype=np.uint8)
    storage.write_parts("c", [memoryview(data)])
    _drop_from_cache(tmp_path / "c")
    fd = os.open(tmp_path / "c", os.O_RDONLY)
    try:
        cold = _file_io._cached_pages(fd, 0, data.nbytes) == 0
    finally:
        os.close(fd)
    spare = np.zeros(data.nbytes + DIRECT_ALIGN, np.uint8)
    target = spare[-spare.ctypes.data % DIRECT_ALIGN :][: data.nbytes]
    if not cold:  # no cachestat(2) (Linux < 6.5), or the cache kept the file
        with storage.open_reader("c") as reader:
            reader.read_into(0, [target.data])
            assert reader._direct == -1  # type: ignore[attr-defined]  # through the cache
        np.testing.assert_array_equal(target, data)
        return
    with storage.open_reader("c") as reader:
        reader.read_into(0, [target.data])  # the unaligned end through the cache
        went_direct = reader._direct >= 0  # type: ignore[attr-defined]
    np.testing.assert_array_equal(target, data)
    if not went_direct:  # a file system refusing O_DIRECT (tmpfs): read as above
        return
    target[:] = 0
    with storage.open_reader("c") as reader:  # only its end in the cache: direct again
        reader.read_into(0, [target.data])
        assert reader._direct >= 0  # type: ignore[attr-defined]
    np.testing.assert_array_equal(target, data)
    (tmp_path / "c").read_bytes()  # the whole file in the cache: read from there
    target[:] = 0
    with storage.open_reader("c") as reader:
        reader.read_into(0, [target.data])
        assert reader._direct == -1  # type: ignore[attr-defined]
    np.testing.assert_array_equal(target, data)
    _drop_from_cache(tmp_path / "c")
    shifted = spare[-spare.ctypes.data % DIRECT_ALIGN + 16 :][: data.nbytes - 16]
    with storage.open_reader("c") as reader:  # offset and memory at one remainder
        reader.read_into(16, [shifted.data])
        assert reader._direct >= 0  # type: ignore[attr-defined]
    np.testing.assert_array_equal(shifted, data[16:])
    os.truncate(tmp_path / "c", DIRECT_FROM + DIRECT_ALIGN)  # a direct read comes short
    _drop_from_cache(tmp_path / "c")
    with pytest.raises(CorruptCheckpointError, match="ends"), storage.open_reader("c") as reader:
        reader.read_into(0, [target.data])
    assert reader._direct == -1  # type: ignore[attr-defined]  # closed with the reader


def test_a_file_system_refusing_direct_reads_is_read_through_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = LocalPath(str(tmp_path))
    data = np.arange(DIRECT_FROM, dtype=np.uint8)
    storage.write_parts("c", [memoryview(data)])
    _drop_from_cache(tmp_path / "c")
    fd = os.open(tmp_path / "c", os.O_RDONLY)
    cold = _file_io._cached_pages(fd, 0, data.nbytes) == 0
    os.close(fd)
    if not cold:  # no cachestat(2) (Linux < 6.5), or the cache kept the file
        with storage.open_reader("c") as reader:
            reader.read_into(0, [memoryview(np.empty_like(data))])
            assert reader._direct == -1  # type: ignore[attr-defined]  # through the cache
        return
    real = os.preadv
    refused: list[int] = []

    def preadv(fd: int, buffers: Any, offset: int, *flags: int) -> int:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:  # what some file systems do
            refused.append(fd)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, buffers, offset, *flags)

    monkeypatch.setattr(_file_io.os, "preadv", preadv)
    spare = np.zeros(data.nbytes + DIRECT_ALIGN, np.uint8)
    target = spare[-spare.ctypes.data % DIRECT_ALIGN :][: data.nbytes]
    with storage.open_reader("c") as reader:
        reader.read_into(0, [target.data])
        assert reader._direct == -1  # type: ignore[attr-defined]
    np.testing.assert_array_equal(target, data)
    if not refused:  # only a file system refusing O_DIRECT at open (tmpfs) never tries
        fd = os.open(tmp_path / "c", os.O_RDONLY)
        try:
            assert _file_io._reopen_direct(fd, os.O_RDONLY) == -1
        finally:
            os.close(fd)


def _drop_from_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def test_missing_and_short_objects(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    with pytest.raises(ObjectNotFoundError) as info:
        storage.read_bytes("absent")
    assert isinstance(info.value, FileNotFoundError)
    assert info.value.key == "absent"
    with pytest.raises(ObjectNotFoundError):
        storage.read_into("absent", 0, [memoryview(bytearray(1))])
    with pytest.raises(StorageError):
        storage.size("absent")
    assert storage.get_document("absent") is None
    assert not storage.exists("absent")
    storage.write_bytes("short", b"abc")
    with pytest.raises(CorruptCheckpointError, match="ends 2 bytes before"):
        storage.read_into("short", 1, [memoryview(bytearray(4))])


def test_a_failed_read_raises_a_storage_error_naming_the_file(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    storage.write_bytes("k", b"abc")
    reader = storage.open_reader("k")
    reader.close()  # its descriptor is gone: the read fails in the system call
    with pytest.raises(StorageError, match=r"could not read .*/k: OSError \(EBADF\)") as info:
        reader.read_into(0, [memoryview(bytearray(3))])
    assert isinstance(info.value, OSError)
    assert isinstance(info.value.__cause__, OSError)  # the system's error, chained


def test_delete_list_and_delete_tree(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    for key in ("d/x", "d/sub/y", "e", "d2/z"):
        storage.write_bytes(key, b"1")
    assert storage.list_keys() == ["d/sub/y", "d/x", "d2/z", "e"]
    assert storage.list_keys("d") == ["d/sub/y", "d/x"]
    assert storage.list_keys("nothing") == []
    storage.delete(["e", "never-existed"])
    storage.delete_tree("d")
    storage.delete_tree("d2/z")  # a single object
    storage.delete_tree("not-there")
    assert storage.list_keys() == []


def test_open_write_streams_a_new_object(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path), durability="fsync")
    with storage.open_write("dir/stream") as stream:
        stream.write(b"abc")
        stream.write(b"def")
    assert storage.read_bytes("dir/stream") == b"abcdef"


def test_put_document_is_atomic_and_leaves_no_temporary(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    storage.put_document("_ckptstore/doc.json", b"{1}")
    storage.put_document("_ckptstore/doc.json", b"{2}")
    assert storage.get_document("_ckptstore/doc.json") == b"{2}"
    assert files_under(tmp_path) == ["_ckptstore/doc.json"]


@pytest.mark.parametrize("mode", DURABILITY_MODES)
def test_every_durability_mode_syncs(tmp_path: Path, mode: str) -> None:
    storage = LocalPath(str(tmp_path), durability=mode)
    assert storage.durability in DURABILITY_MODES
    storage.write_bytes("a/b", b"x")
    with storage.open_write("a/c") as stream:
        stream.write(b"y")
    storage.sync()
    assert storage.read_bytes("a/c") == b"y"


def test_durability_from_the_environment_and_validation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CKPTSTORE_DURABILITY", "none")
    assert LocalPath(str(tmp_path)).durability == "none"
    assert LocalPath(str(tmp_path), durability="fsync").durability == "fsync"
    with pytest.raises(ValueError, match="durability"):
        LocalPath(str(tmp_path), durability="sometimes")
    with pytest.raises(TypeError, match="only 'durability'"):
        LocalPath(str(tmp_path), key="secret")


def _opened_direct(fd: int) -> bool:
    with open(f"/proc/self/fdinfo/{fd}") as info:
        flags = next(line for line in info if line.startswith("flags:")).split()[1]
    return bool(int(flags, 8) & os.O_DIRECT)


def test_large_arrays_are_written_o_direct_and_read_back(tmp_path: Path) -> None:
    """With fsync durability, the aligned interior of a large array goes through a
    descriptor opened O_DIRECT; the header before it and its unaligned end through the
    page cache; the file holds exactly the bytes written."""
    storage = LocalPath(str(tmp_path))
    assert storage.direct_io
    array = np.random.default_rng(5).integers(0, 255, 3 * DIRECT_FROM + 123, dtype=np.uint8)
    header = b"h" * 100
    at = DIRECT_ALIGN + memory_residue(array) - len(header)  # the array's data: congruent
    size = at + len(header) + array.nbytes
    with storage.open_positional("f", size) as writer:
        writer.write_at(0, [b"\0" * at])
        writer.write_at(at, [header, array])
        assert _opened_direct(writer._direct)  # type: ignore[attr-defined]
        assert not writer._refused  # type: ignore[attr-defined]
    assert (tmp_path / "f").read_bytes() == b"\0" * at + header + array.tobytes()


def test_a_refused_direct_write_falls_back_to_the_page_cache(tmp_path: Path) -> None:
    """The kernel refuses (EINVAL) an O_DIRECT write from misaligned memory: that write
    and every later one of the file go through the page cache, and no byte is lost."""
    storage = LocalPath(str(tmp_path))
    backing = np.arange(4 * DIRECT_FROM, dtype=np.uint8)
    misaligned = backing[(1 - memory_residue(backing)) % DIRECT_ALIGN :][: 2 * DIRECT_FROM]
    with storage.open_positional("f", misaligned.nbytes + DIRECT_ALIGN) as writer:
        writer._write_direct(memoryview(misaligned), 0)  # type: ignore[attr-defined]
        assert writer._refused  # type: ignore[attr-defined]
        writer.write_at(misaligned.nbytes, [b"t" * DIRECT_ALIGN])
    assert (tmp_path / "f").read_bytes() == misaligned.tobytes() + b"t" * DIRECT_ALIGN


def test_direct_io_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert not LocalPath(str(tmp_path), direct_io=False).direct_io
    assert not LocalPath(str(tmp_path), durability="none").direct_io  # scratch space
    with pytest.raises(ValueError, match="direct_io must be true or false"):
        LocalPath(str(tmp_path), direct_io="yes")  # type: ignore[arg-type]
    monkeypatch.setenv("CKPTSTORE_DIRECT_IO", "off")
    assert not LocalPath(str(tmp_path)).direct_io
    assert LocalPath(str(tmp_path), direct_io=True).direct_io
    writer = LocalPath(str(tmp_path)).open_positional("g", DIRECT_FROM)
    assert writer._direct == -1  # type: ignore[attr-defined]  # no O_DIRECT descriptor
    writer.abort()


def test_files_in_memory_are_written_through_the_page_cache(
    tmp_path: Path, small_disk: Path
) -> None:
    """tmpfs has no device to bypass the cache for (O_DIRECT writes there were measured
    slower): a file on a real tmpfs mount gets no O_DIRECT descriptor, one on the disk
    does, and the bytes arrive either way."""
    array = np.arange(DIRECT_FROM, dtype=np.uint8)
    for root, direct in ((small_disk, False), (tmp_path, True)):
        storage = LocalPath(str(root))
        assert storage.direct_io
        with storage.open_positional("f", array.nbytes) as writer:
            assert (writer._direct >= 0) is direct  # type: ignore[attr-defined]
            writer.write_at(0, [array])
        assert (root / "f").read_bytes() == array.tobytes()


@contextmanager
def only_cpu(cpu: int) -> Iterator[None]:
    """This thread may run on one CPU only (what the process's affinity mask would say)."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def test_a_root_in_memory_moves_at_most_one_chunk_per_usable_cpu(
    tmp_path: Path, small_disk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On tmpfs every read and write is a CPU's copy: more at once than the CPUs this
    process may use only take turns. A root not made yet is judged by the directory it
    will be made in; the disk keeps its 4; the environment and ``io=`` still decide."""
    with only_cpu(min(os.sched_getaffinity(0))):
        for root in (small_disk, small_disk / "runs" / "a"):
            assert LocalPath(str(root)).default_io.concurrency == 1
        assert LocalPath(str(tmp_path / "runs")).default_io.concurrency == 4
        monkeypatch.setenv("CKPTSTORE_IO_CONCURRENCY", "3")
        manager = CheckpointManager(str(small_disk), "trainer_0", "zarr")
        assert manager.location.io_settings.concurrency == 3
    assert LocalPath(str(small_disk)).default_io.concurrency == min(4, usable_cpus())


def test_large_writes_through_the_page_cache_start_their_write_back_at_once(
    tmp_path: Path, small_disk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cached write of ``EARLY_WRITEBACK_BYTES`` or more into a file that will be
    synced has its range's write-back started as soon as it is written (the disk works
    while the rest is written, not all at close); a smaller write, a file that will not
    be synced (``durability="none"``) and a file in memory (tmpfs) do not. The bytes
    arrive every time."""
    started: list[tuple[str, int, int]] = []
    real = _file_io._start_writeback

    def recording(fd: int, offset: int = 0, length: int = 0) -> None:
        started.append((os.readlink(f"/proc/self/fd/{fd}"), offset, length))
        real(fd, offset, length)

    monkeypatch.setattr(_file_io, "_start_writeback", recording)
    large = np.random.default_rng(3).integers(0, 255, EARLY_WRITEBACK_BYTES + 5, np.uint8)
    small = b"s" * 100
    cases = [(tmp_path / "ext4", "fsync", True), (tmp_path / "scratch", "none", False)]
    cases.append((small_disk, "fsync", False))
    for root, durability, early in cases:
        storage = LocalPath(str(root), durability=durability, direct_io=False)
        started.clear()
        with storage.open_positional("f", len(small) + large.nbytes) as writer:
            writer.write_at(0, [small])
            writer.write_at(len(small), [large])
            expected = [(str(root / "f"), len(small), large.nbytes)] if early else []
            assert started == expected, root
        assert (root / "f").read_bytes() == small + large.tobytes()


def test_roots_from_urls_and_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert LocalPath(f"file://{tmp_path}").root == str(tmp_path)
    assert LocalPath(f"local://{tmp_path}").root == str(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert LocalPath("~/ckpt").root == str(tmp_path / "ckpt")
    monkeypatch.chdir(tmp_path)
    assert LocalPath("relative").root == str(tmp_path / "relative")


def test_accessible_creates_the_root_or_says_no(tmp_path: Path) -> None:
    assert LocalPath(str(tmp_path / "new" / "root")).accessible()
    assert (tmp_path / "new" / "root").is_dir()
    (tmp_path / "file").write_text("")
    assert not LocalPath(str(tmp_path / "file" / "root")).accessible()


def test_writes_under_a_file_fail_as_storage_errors(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    storage = LocalPath(str(tmp_path / "file"))
    with pytest.raises(StorageError) as info:
        storage.write_bytes("k", b"x")
    assert isinstance(info.value, OSError)
    assert str(tmp_path / "file") in str(info.value)


def test_local_paths_pickle(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path), durability="fsync")
    storage.write_bytes("k", b"v")
    copy = pickle.loads(pickle.dumps(storage))
    assert copy.root == storage.root
    assert copy.durability == "fsync"
    assert copy.read_bytes("k") == b"v"
    copy.write_bytes("k2", b"w")
    copy.sync()


def test_the_registry_serves_plain_paths_and_file_urls(registry: Registry, tmp_path: Path) -> None:
    for url in (str(tmp_path), f"file://{tmp_path}", f"local://{tmp_path}"):
        assert type(registry.open_path(url)) is LocalPath
    assert repr(LocalPath(str(tmp_path))) == f"LocalPath({str(tmp_path)!r})"


def test_prepare_keys_creates_each_parent_once_and_fsync_mode_syncs_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = LocalPath(str(tmp_path), durability="fsync")
    storage.prepare_keys(["a/b/c.0", "a/b/zarr.json", "a/zarr.json", "d/c"])
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == [
        "a",
        "a/b",
        "d",
    ]
    synced = recorded_fsyncs(monkeypatch)
    storage.sync()
    # every created directory, and the parents holding their entries
    assert {str(tmp_path), str(tmp_path / "a"), str(tmp_path / "a/b"), str(tmp_path / "d")} <= set(
        synced
    )


# -- links inside the root (docs/security.md) ------------------------------------------


@pytest.fixture
def linked_root(tmp_path: Path) -> tuple[LocalPath, Path]:
    """A root whose ``linked/`` directory and ``data/file`` are links to ``outside``."""
    outside = tmp_path / "outside"
    (outside / "dir").mkdir(parents=True)
    (outside / "secret").write_bytes(b"secret")
    (outside / "dir" / "doc").write_bytes(b"outside doc")
    root = tmp_path / "root"
    (root / "data").mkdir(parents=True)
    (root / "linked").symlink_to(outside / "dir")
    (root / "data" / "file").symlink_to(outside / "secret")
    return LocalPath(str(root)), outside


def test_reads_never_follow_a_link_out_of_the_root(linked_root: tuple[LocalPath, Path]) -> None:
    storage, _ = linked_root
    for key in ("data/file", "linked/doc"):
        with pytest.raises(CorruptCheckpointError, match="symbolic link"):
            storage.read_bytes(key)
        with pytest.raises(CorruptCheckpointError, match="symbolic link"):
            storage.read_into(key, 0, [memoryview(bytearray(3))])
        with pytest.raises(CorruptCheckpointError, match="symbolic link"):
            storage.size(key)
    assert storage.list_keys() == []
    assert storage.list_keys("linked") == []


def test_writes_and_deletes_never_go_through_a_link(
    linked_root: tuple[LocalPath, Path], tmp_path: Path
) -> None:
    storage, outside = linked_root
    hard = tmp_path / "root" / "data" / "hard"
    hard.hardlink_to(outside / "secret")
    storage.write_bytes("data/file", b"new")  # the symlink is replaced, not followed
    storage.write_bytes("data/hard", b"new")  # the hard link is replaced, not written
    with storage.open_write("data/other") as stream:
        stream.write(b"x")
    with pytest.raises(CorruptCheckpointError):
        storage.put_document("linked/doc", b"{}")  # a control dir that is a link
    with pytest.raises(CorruptCheckpointError):
        storage.delete(["linked/doc"])
    storage.delete_tree("linked")  # removes the link only
    assert (outside / "secret").read_bytes() == b"secret"
    assert (outside / "dir" / "doc").read_bytes() == b"outside doc"
    assert storage.read_bytes("data/file") == b"new"
    assert not (tmp_path / "root" / "linked").exists()


@pytest.mark.parametrize("change", ["removed", "replaced by a link", "replaced by a file"])
def test_a_directory_changed_between_listing_and_opening_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    """A listing that races a writer: a directory listed as one, then gone, or swapped
    for a link out of the root or a file before it is opened, is left out (never
    followed), and everything else is still listed."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"secret")
    root = tmp_path / "root"
    storage = LocalPath(str(root))
    for key in ("run/kept", "run/moving/doc", "run/stays/doc"):
        storage.write_bytes(key, b"x")
    moving = root / "run" / "moving"
    scandir = os.scandir

    @contextmanager
    def listed_then_changed(fd: int) -> Iterator[list[os.DirEntry[str]]]:
        with scandir(fd) as entries:
            found = list(entries)  # each entry keeps the type it was listed with
        if moving.is_dir() and any(entry.name == "moving" for entry in found):
            for child in moving.iterdir():
                child.unlink()
            moving.rmdir()  # the real change, after the listing and before the open
            if change == "replaced by a link":
                moving.symlink_to(outside)
            elif change == "replaced by a file":
                moving.write_bytes(b"now a file")
        yield found

    monkeypatch.setattr(os, "scandir", listed_then_changed)
    keys = storage.list_keys("run")
    monkeypatch.undo()
    assert keys == ["run/kept", "run/stays/doc"]
    assert (outside / "secret").read_bytes() == b"secret"


def test_a_fifo_is_refused_without_hanging(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(CorruptCheckpointError):
        LocalPath(str(tmp_path)).read_bytes("fifo")


def test_a_directory_that_cannot_be_read_fails_a_listing_instead_of_looking_empty(
    tmp_path: Path,
) -> None:
    storage = LocalPath(str(tmp_path))
    for epoch in (1, 2):
        storage.write_bytes(f"_ckptstore/epoch-{epoch}/trainer_0.commit.json", b"{}")
    unreadable = tmp_path / "_ckptstore" / "epoch-2"
    unreadable.chmod(0)
    try:
        with file_permissions_enforced():
            with pytest.raises(StorageError, match="EACCES") as info:
                storage.list_keys("_ckptstore")  # not just epoch 1's record
            assert is_permanent(info.value)
            with pytest.raises(StorageError, match="EACCES"):
                committed_epochs(storage)  # what a resume lists: never "epoch 1 is newest"
    finally:
        unreadable.chmod(0o755)
    assert committed_epochs(storage) == [1, 2]


def test_a_key_whose_directory_cannot_be_read_is_an_error_not_absent(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    storage.write_bytes("run/_ckptstore/epoch-2/trainer_0.commit.json", b"{}")
    unreadable = tmp_path / "run" / "_ckptstore"
    unreadable.chmod(0)
    try:
        with file_permissions_enforced(), pytest.raises(StorageError, match="EACCES"):
            storage.exists("run/_ckptstore/epoch-2/trainer_0.commit.json")
    finally:
        unreadable.chmod(0o755)
    assert storage.exists("run/_ckptstore/epoch-2/trainer_0.commit.json")
    assert not storage.exists("run/_ckptstore/epoch-3/trainer_0.commit.json")


def test_remove_empty_directory_removes_only_an_empty_one(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    storage.write_bytes("node.1/attempt-a/file", b"x")
    (tmp_path / "node.2").mkdir()
    storage.remove_empty_directory("node.1")  # another save's files stay
    storage.remove_empty_directory("node.2")
    storage.remove_empty_directory("node.3")  # nothing there: nothing to do
    assert (tmp_path / "node.1" / "attempt-a" / "file").read_bytes() == b"x"
    assert not (tmp_path / "node.2").exists()


# -- what incremental saves ask for (docs/design.md, "Incremental checkpoints") --------


@pytest.mark.parametrize("listed", [True, False], ids=["directory listed", "a stat per name"])
def test_existing_answers_as_exists_does(
    linked_root: tuple[LocalPath, Path], monkeypatch: pytest.MonkeyPatch, listed: bool
) -> None:
    storage, _ = linked_root
    monkeypatch.setattr(_local_path, "_LISTED_ENTRY_BYTES", 1 << 30 if listed else 0)
    storage.write_bytes("data/a", b"a")
    storage.write_bytes("data/sub/b", b"b")
    storage.write_bytes("top", b"t")
    asked = ["data/a", "data/sub", "data/file", "data/missing", "gone/x", "top", "nope"]
    assert storage.existing(asked) == {k for k in asked if storage.exists(k)}
    assert storage.existing(asked) == {"data/a", "data/sub", "data/file", "top"}
    for through in ("linked/doc", "top/x"):  # a link, a file: never looked up through
        with pytest.raises(CorruptCheckpointError, match="symbolic link"):
            storage.existing([through])
        with pytest.raises(CorruptCheckpointError, match="symbolic link"):
            storage.exists(through)


def test_a_volatile_document_is_created_once_without_a_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = LocalPath(str(tmp_path), durability="fsync")
    synced: list[int] = []
    monkeypatch.setattr(os, "fsync", synced.append)
    storage.create_volatile_document("intents/a.json", b"{}")
    assert synced == []
    with pytest.raises(KeyExistsError):
        storage.create_volatile_document("intents/a.json", b"{ }")
    assert storage.read_bytes("intents/a.json") == b"{}"
    assert storage.list_keys("intents") == ["intents/a.json"]  # no temporary left
    storage.create_document("intents/b.json", b"{}")
    assert len(synced) == 2  # the file, then its directory


def test_sync_fsyncs_every_directory_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The directories of a save are synced on threads of their own, all waited for;
    one removed meanwhile is skipped, and an error of any one is raised."""
    storage = LocalPath(str(tmp_path), durability="fsync")
    storage.prepare_keys(["a/b/c/-", "d/-", "e/-"])
    (tmp_path / "e").rmdir()
    barrier = threading.Barrier(4, timeout=10)  # four fsyncs meet: they run at once
    real_fsync = os.fsync
    synced: list[str] = []

    def meet(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        barrier.wait()
        synced.append(path)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", meet)
    storage.sync()
    assert sorted(synced) == sorted(str(tmp_path / p) for p in ("", "a/b", "a/b/c", "d"))
    storage.prepare_keys(["f/-", "g/-"])

    def fail(fd: int) -> None:
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(StorageError, match="I/O error"):
        storage.sync()
