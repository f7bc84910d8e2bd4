"""Loads the ``ckptstore.testing`` pytest plugin for its own tests (installed, ckptstore
registers it through its pytest11 entry point and this is a no-op)."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    if not config.pluginmanager.has_plugin("ckptstore.testing"):
        config.pluginmanager.import_plugin("ckptstore.testing")
