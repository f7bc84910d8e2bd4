"""Shared fixtures: a clean plugin registry around every test."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ckptstore.plugin._registry import Registry, reset_registry


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
