"""Shared fixtures: a clean plugin registry around every test; whether the write watch
works; the chunks incremental saves hash."""

from __future__ import annotations

import platform
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from ckptstore.io import WRITE_WATCH_ENV, write_watch
from ckptstore.plugin._registry import Registry, reset_registry
from ckptstore.protocol import _chunks

WATCH_KERNEL = (6, 7)
"""The first Linux with userfaultfd's asynchronous write protection and PAGEMAP_SCAN."""


@pytest.fixture(autouse=True)
def registry() -> Iterator[Registry]:
    """A freshly built registry, rebuilt again after the test (plugins a test registers
    or blocks never leak into the next one)."""
    fresh = reset_registry()
    yield fresh
    reset_registry()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 2 MiB tmpfs mounted for the test (the tests run as root) and unmounted
    after it, for full-disk and read-only scenarios (``mount -o remount,ro``)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "--lazy", str(mount)], check=True)


@pytest.fixture
def write_watched(monkeypatch: pytest.MonkeyPatch) -> None:
    """The process's write watch works (``CKPTSTORE_WRITE_WATCH`` unset). Skipped only on
    a kernel before Linux 6.7 (the feature's first); on a later one a watch that cannot
    start fails the test."""
    monkeypatch.delenv(WRITE_WATCH_ENV, raising=False)
    found = re.match(r"(\d+)\.(\d+)", platform.release())
    kernel = (int(found[1]), int(found[2])) if found else (0, 0)
    if platform.system() != "Linux" or kernel < WATCH_KERNEL:
        pytest.skip(f"the write watch needs Linux 6.7+ (here {platform.release()})")
    probe = np.ones(1 << 20, np.uint8)
    watched = write_watch().look("probe", probe.ctypes.data, probe.nbytes, 0).stamp
    write_watch().release(probe.ctypes.data, probe.nbytes)
    assert watched, "Linux 6.7+ but no write watch: userfaultfd refused? (see the log)"


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the chunks incremental saves hash (read), in order."""
    sizes: list[int] = []
    real = _chunks.xxhash.xxh3_128_hexdigest

    def counted(data: memoryview) -> str:
        sizes.append(data.nbytes)
        return real(data)

    monkeypatch.setattr(_chunks.xxhash, "xxh3_128_hexdigest", counted)
    return sizes
