"""Fixtures of the S3 plugin's tests: the ``ckptstore.testing`` pytest plugin (servers,
buckets, fault proxy) and a clean plugin registry around every test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ckptstore.plugin.registry import Registry, reset_registry


def pytest_configure(config: pytest.Config) -> None:
    # Installed, ckptstore registers the plugin through its pytest11 entry point.
    if not config.pluginmanager.has_plugin("ckptstore.testing"):
        config.pluginmanager.import_plugin("ckptstore.testing")


@pytest.fixture(autouse=True)
def registry() -> Iterator[Registry]:
    fresh = reset_registry()
    yield fresh
    reset_registry()
