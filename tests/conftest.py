"""Shared fixtures: a clean plugin registry around every test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ckptstore.plugin._registry import Registry, reset_registry


@pytest.fixture(autouse=True)
def registry() -> Iterator[Registry]:
    """A freshly built registry, rebuilt again after the test (plugins a test registers
    or blocks never leak into the next one)."""
    fresh = reset_registry()
    yield fresh
    reset_registry()
