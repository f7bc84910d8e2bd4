"""Fixtures of the crash-state explorer: a scratch directory in memory."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def scratch(tmp_path: Path) -> Iterator[Path]:
    """A directory on tmpfs (``/dev/shm``) where crash states are laid out and checked:
    the checks' own saves sync nothing to a disk. ``tmp_path`` where there is none."""
    if not Path("/dev/shm").is_dir():
        yield tmp_path / "scratch"
        return
    directory = Path(tempfile.mkdtemp(prefix="ckptstore-crash-states-", dir="/dev/shm"))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)
