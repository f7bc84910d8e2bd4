"""CRC-32C over buffers of every kind and size gives the standard checksum."""

from __future__ import annotations

import numpy as np
import pytest

from ckptstore.io._checksum import COPY_BELOW, crc32c_of

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
