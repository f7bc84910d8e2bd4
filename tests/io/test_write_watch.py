"""The write watch: the kernel's record of which pages were written since a look."""

from __future__ import annotations

import ctypes
import mmap
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ckptstore.errors import EnvironmentVariableError
from ckptstore.io import WRITE_WATCH_ENV, WriteWatch

MiB = 1 << 20
PAGE = mmap.PAGESIZE
MADV_DONTNEED = 4


def own_pages(nbytes: int) -> np.ndarray[Any, Any]:
    """Written memory of its own, at an offset into its first page as the heap's is (the
    process's watch may hold other memory, which another watch cannot register)."""
    memory = mmap.mmap(-1, nbytes + PAGE, flags=mmap.MAP_PRIVATE)
    array = np.frombuffer(memory, np.uint8)[16 : 16 + nbytes]
    array[:] = 1
    return array


@pytest.fixture
def watch(write_watched: None) -> Iterator[WriteWatch]:
    """A watch of its own (not the process's)."""
    fresh = WriteWatch()
    probe = own_pages(MiB)
    assert fresh.look("probe", probe.ctypes.data, probe.nbytes, 0).stamp
    yield fresh
    fresh.close()


def look_again(watch: WriteWatch, consumer: str, array: np.ndarray[Any, Any], stamp: int) -> Any:
    return watch.look(consumer, array.ctypes.data, array.nbytes, stamp)


def test_a_write_shows_in_the_next_look_for_its_pages_only(watch: WriteWatch) -> None:
    array = own_pages(16 * MiB)
    first = look_again(watch, "a", array, 0)
    assert first.stamp
    assert first.written is None
    assert not first.unchanged(0, PAGE)
    array[5 * MiB + 7] = 2
    second = look_again(watch, "a", array, first.stamp)
    assert second.unchanged(0, 4 * MiB)
    assert second.unchanged(8 * MiB, 8 * MiB)
    assert not second.unchanged(4 * MiB, 4 * MiB)
    third = look_again(watch, "a", array, second.stamp)
    assert third.unchanged(0, array.nbytes)  # the write was seen once


def test_a_write_by_the_kernel_into_the_memory_is_seen(watch: WriteWatch, tmp_path: Path) -> None:
    array = own_pages(4 * MiB)
    first = look_again(watch, "a", array, 0)
    source = tmp_path / "bytes"
    source.write_bytes(b"x" * 100)
    with source.open("rb") as file:
        file.readinto(memoryview(array)[3 * MiB : 3 * MiB + 100])
    second = look_again(watch, "a", array, first.stamp)
    assert not second.unchanged(3 * MiB, PAGE)
    assert second.unchanged(0, 2 * MiB)


def test_each_consumer_sees_every_write_whoever_looked_first(watch: WriteWatch) -> None:
    array = own_pages(8 * MiB)
    stamps = {name: look_again(watch, name, array, 0).stamp for name in ("a", "b")}
    sub = array[PAGE : PAGE + MiB]  # another range over the same pages
    stamps["sub"] = look_again(watch, "sub", sub, 0).stamp
    array[PAGE + 10] = 9
    a = look_again(watch, "a", array, stamps["a"])  # protects the page again
    assert not a.unchanged(PAGE, PAGE)
    b = look_again(watch, "b", array, stamps["b"])
    assert not b.unchanged(PAGE, PAGE)
    assert b.unchanged(2 * PAGE, MiB)
    assert not look_again(watch, "sub", sub, stamps["sub"]).unchanged(0, PAGE)


def test_watching_a_range_that_overlaps_another_hides_no_write_from_it(
    watch: WriteWatch,
) -> None:
    array = own_pages(8 * MiB)
    first = look_again(watch, "a", array, 0)
    array[3 * MiB] = 2
    look_again(watch, "sub", array[2 * MiB : 4 * MiB], 0)  # protects those pages anew
    assert not look_again(watch, "a", array, first.stamp).unchanged(3 * MiB, 1)


def test_a_look_not_followed_up_makes_the_next_one_unknown(watch: WriteWatch) -> None:
    """A save that looked and then failed is not remembered: the next save passes the
    stamp before it, and is told nothing is known."""
    array = own_pages(4 * MiB)
    first = look_again(watch, "a", array, 0)
    look_again(watch, "a", array, first.stamp)  # a save that failed
    assert look_again(watch, "a", array, first.stamp).written is None


def test_dropped_content_counts_as_written(watch: WriteWatch) -> None:
    array = own_pages(8 * MiB)
    first = look_again(watch, "a", array, 0)
    page = (array.ctypes.data + 6 * MiB) // PAGE * PAGE
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.madvise(ctypes.c_void_p(page), PAGE, MADV_DONTNEED) == 0
    second = look_again(watch, "a", array, first.stamp)
    assert array[page - array.ctypes.data] == 0  # the kernel dropped the page's bytes
    assert not second.unchanged(page - array.ctypes.data, PAGE)
    assert second.unchanged(0, 4 * MiB)


def test_memory_another_process_or_a_file_can_change_is_not_watched(
    watch: WriteWatch, tmp_path: Path
) -> None:
    shared = mmap.mmap(-1, 4 * MiB, flags=mmap.MAP_SHARED)
    path = tmp_path / "file"
    path.write_bytes(bytes(4 * MiB))
    with path.open("r+b") as file:
        mapped = mmap.mmap(file.fileno(), 4 * MiB, flags=mmap.MAP_PRIVATE)
    for memory in (shared, mapped):
        array = np.frombuffer(memory, np.uint8)
        assert look_again(watch, "a", array, 0).stamp == 0
        del array
        memory.close()


def test_memory_unmapped_and_mapped_again_is_unknown(watch: WriteWatch) -> None:
    first = mmap.mmap(-1, 4 * MiB, flags=mmap.MAP_PRIVATE)
    array = np.frombuffer(first, np.uint8)
    address = array.ctypes.data
    before = watch.look("a", address, 4 * MiB, 0)
    del array
    first.close()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t] + [ctypes.c_int] * 3 + [ctypes.c_long]
    map_fixed, map_private, map_anonymous = 0x10, 0x02, 0x20
    again = libc.mmap(address, 4 * MiB, 3, map_fixed | map_private | map_anonymous, -1, 0)
    assert again == address
    try:
        assert watch.look("a", address, 4 * MiB, before.stamp).written is None
    finally:
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.munmap(ctypes.c_void_p(address), 4 * MiB)


def test_a_forked_child_starts_its_own_watch(watch: WriteWatch) -> None:
    array = own_pages(4 * MiB)
    first = look_again(watch, "a", array, 0)
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the parent's stamp means nothing here
        mine = look_again(watch, "a", array, first.stamp)
        array[0] = 5
        again = look_again(watch, "a", array, mine.stamp)
        os.write(write, bytes([mine.written is None, not again.unchanged(0, PAGE)]))
        os._exit(0)
    os.close(write)
    answer = os.read(read, 2)
    os.waitpid(child, 0)
    assert answer == b"\x01\x01"
    parent = look_again(watch, "a", array, first.stamp)  # the child's write is its own
    assert parent.unchanged(0, array.nbytes)
    assert array[0] == 1


def test_released_or_disabled_memory_is_unknown(watch: WriteWatch) -> None:
    array = own_pages(4 * MiB)
    first = look_again(watch, "a", array, 0)
    watch.release(array.ctypes.data, array.nbytes)
    second = look_again(watch, "a", array, first.stamp)
    assert second.written is None
    assert second.stamp
    watch.disable("a test")
    assert look_again(watch, "a", array, second.stamp).stamp == 0


def test_the_environment_turns_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    array = own_pages(MiB)
    monkeypatch.setenv(WRITE_WATCH_ENV, "off")
    assert WriteWatch().look("a", array.ctypes.data, array.nbytes, 0).stamp == 0
    monkeypatch.setenv(WRITE_WATCH_ENV, "no")
    with pytest.raises(EnvironmentVariableError, match=WRITE_WATCH_ENV):
        WriteWatch().look("a", array.ctypes.data, array.nbytes, 0)


def test_a_neighbours_write_to_a_shared_end_page_leaves_the_range_unchanged(
    watch: WriteWatch,
) -> None:
    """On the heap an allocation shares its end pages with its neighbours, whose
    records the allocator writes: the range's own bytes there decide."""
    memory = own_pages(4 * MiB)
    array, neighbour = memory[: 2 * MiB + 100], memory[2 * MiB + 100 :]
    first, ends = look_again(watch, "a", array, 0).settle_ends(array.data, None)
    neighbour[0] = 7  # in the range's last page
    memory[0] = 1  # the range's own first byte, written with the byte it held
    second, ends = look_again(watch, "a", array, first.stamp).settle_ends(array.data, ends)
    assert second.unchanged(0, array.nbytes)
    array[-1] = 9  # its own byte in the shared page
    third, _ = look_again(watch, "a", array, second.stamp).settle_ends(array.data, ends)
    assert not third.unchanged(array.nbytes - 1, 1)
    assert third.unchanged(0, array.nbytes - mmap.PAGESIZE - 100)
