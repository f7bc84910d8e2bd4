"""CRC-32 and CRC-32C over buffers of every kind and size give the standard checksums,
without holding the GIL over large buffers."""

from __future__ import annotations

import statistics
import threading
import time
import zlib
from collections.abc import Callable, Iterable

import numpy as np
import pytest

from ckptstore._types import Buffer
from ckptstore.io._checksum import (
    CHECKSUM_ALGORITHM,
    CHECKSUM_ALGORITHMS,
    COPY_BELOW,
    checksum_of,
    crc32_combine,
    crc32_of,
    crc32c_of,
    releases_the_gil,
)

CHECK_VALUE = 0xE3069283
"""CRC-32C of b"123456789" (the standard check value)."""
CRC32_CHECK_VALUE = 0xCBF43926
"""CRC-32 of b"123456789"."""


def test_the_standard_check_values() -> None:
    assert crc32_of([b"1234", memoryview(b"56789")]) == CRC32_CHECK_VALUE
    assert crc32_of([bytearray(b"123"), np.frombuffer(b"456789", np.uint8)]) == CRC32_CHECK_VALUE
    assert crc32_of([]) == 0
    assert crc32c_of([b"123456789"]) == CHECK_VALUE
    assert crc32c_of([b"1234", memoryview(b"56789")]) == CHECK_VALUE
    assert crc32c_of([bytearray(b"123"), np.frombuffer(b"456789", np.uint8)]) == CHECK_VALUE
    assert crc32c_of([]) == 0


@pytest.mark.parametrize("readonly", [False, True])
def test_large_parts_match_bytes_and_any_split(readonly: bool) -> None:
    data = np.random.default_rng(7).integers(0, 256, 5 * COPY_BELOW + 3, dtype=np.uint8)
    data.flags.writeable = not readonly
    whole = crc32c_of([data.tobytes()])
    floats = data[: 4 * COPY_BELOW].view(np.float32)  # multi-byte items are cast to bytes
    assert crc32c_of([data]) == whole
    assert crc32c_of([floats, data[4 * COPY_BELOW :]]) == whole
    assert crc32c_of([data[:10], memoryview(data)[10:]]) == whole
    assert crc32c_of([data[1:]], crc32c_of([data[:1]])) == whole
    assert crc32c_of([data[:-1]]) != whole


def test_chunks_are_checked_by_crc32_and_both_algorithms_can_be_named() -> None:
    data = np.random.default_rng(8).integers(0, 256, 3 * COPY_BELOW, dtype=np.uint8)
    assert CHECKSUM_ALGORITHM == "crc32"
    assert set(CHECKSUM_ALGORITHMS) == {"crc32", "crc32c"}
    assert checksum_of("crc32")([data]) == zlib.crc32(data.tobytes()) == crc32_of([data])
    assert checksum_of("crc32c")([data]) == crc32c_of([data.tobytes()])
    head, tail = data[:1000], data[1000:]
    assert crc32_combine(crc32_of([head]), crc32_of([tail]), tail.nbytes) == crc32_of([data])
    assert crc32_combine(crc32_of([head]), 0, 0) == crc32_of([head])
    with pytest.raises(KeyError):
        checksum_of("sha1")


PAUSE = 1e-4
"""A gap between two steps of the other thread longer than this (s) is a pause (a step
takes well under a microsecond)."""


def median_pause_share(function: Callable[[], object], calls: int) -> float:
    """Calls ``function`` ``calls`` times while another thread keeps taking steps of
    Python; returns the median, over the calls, of that thread's longest pause within a
    call as a share of the call's duration.

    A function that holds the GIL stops the other thread for the whole call: about 1. One
    that releases it leaves the other thread running: its pauses are the scheduler's
    slices (a few ms), well under half of a call that lasts tens of ms, even with every
    core busy elsewhere (0.05-0.2 with two spinning processes on two cores).

    The other thread notes each pause with its start and end, and the calls' own start
    and end are compared with them afterwards: a thread held up for a whole call can
    only note the pause after it, when the call may already be over."""
    pauses: list[tuple[float, float]] = []
    stop = threading.Event()

    def step() -> None:
        last = time.perf_counter()
        while not stop.is_set():
            now = time.perf_counter()
            if now - last > PAUSE:
                pauses.append((last, now))
            last = now
        pauses.append((last, time.perf_counter()))  # held up until the stop, perhaps

    stepper = threading.Thread(target=step)
    stepper.start()
    spans = []
    try:
        for _ in range(calls):
            started = time.perf_counter()
            function()
            spans.append((started, time.perf_counter()))
    finally:
        stop.set()
        stepper.join()
    return statistics.median(
        max([0.0, *(min(end, until) - max(start, since) for since, until in pauses)])
        / (end - start)
        for start, end in spans
    )


def test_the_pause_measure_sees_a_call_that_holds_the_gil() -> None:
    """``bytes.count`` holds the GIL: the measure the next test relies on must say so."""
    data = bytes(256 << 20)
    assert median_pause_share(lambda: data.count(b"\x01"), calls=3) > 0.5


@pytest.mark.parametrize("checksum", [crc32c_of, crc32_of], ids=["crc32c", "crc32"])
def test_large_parts_are_checksummed_without_the_gil(
    checksum: Callable[[Iterable[Buffer]], int],
) -> None:
    """A background save's checksums must not stop the training thread. 512 MiB takes
    tens of ms with either algorithm, several scheduler slices: with 128 MiB, ISA-L's
    CRC-32 took about 9 ms, and on a busy 2-core CI machine the other thread's share of
    pause reached 0.5 from the scheduler alone."""
    assert releases_the_gil()  # google-crc32c's C function is found on this platform
    data = np.ones(512 << 20, dtype=np.uint8)
    values = set()
    share = median_pause_share(lambda: values.add(checksum([data])), calls=10)
    assert len(values) == 1
    assert share < 0.5, f"the other thread paused for {share:.2f} of each checksum"
