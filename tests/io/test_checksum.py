"""CRC-32C over buffers of every kind and size gives the standard checksum."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from ckptstore.io._checksum import COPY_BELOW, crc32c_of, releases_the_gil

CHECK_VALUE = 0xE3069283
"""CRC-32C of b"123456789" (the standard check value)."""


def test_the_standard_check_value() -> None:
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


def test_large_parts_are_checksummed_without_the_gil() -> None:
    """A background save's checksums must not stop the training thread: while this thread
    checksums 128 MiB (several ms), another keeps taking steps of Python. Holding the
    GIL, the other thread would stand still for the whole checksum: its longest pause
    would be as long as the call (median of ten calls, against scheduling noise)."""
    assert releases_the_gil()  # google-crc32c's C function is found on this platform
    data = np.ones(128 << 20, dtype=np.uint8)
    expected = crc32c_of([data.tobytes()])
    call = [-1]  # the call in progress, -1 between calls
    pauses = [0.0] * 10  # the other thread's longest pause during each call
    stop = threading.Event()

    def step() -> None:
        last = time.perf_counter()
        while not stop.is_set():
            now = time.perf_counter()
            if call[0] >= 0:
                pauses[call[0]] = max(pauses[call[0]], now - last)
            last = now

    stepper = threading.Thread(target=step)
    stepper.start()
    durations = []
    try:
        for number in range(10):
            started = time.perf_counter()
            call[0] = number
            assert crc32c_of([data]) == expected
            call[0] = -1
            durations.append(time.perf_counter() - started)
    finally:
        stop.set()
        stepper.join()
    ratios = sorted(pause / duration for pause, duration in zip(pauses, durations, strict=True))
    assert ratios[5] < 0.4, f"the other thread paused for {ratios} of each checksum"
