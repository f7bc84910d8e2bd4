"""Fixtures of the GCS plugin's tests: the ``ckptstore.testing`` pytest plugin (servers,
buckets, fault proxy) and a clean plugin registry around every test."""

from __future__ import annotations

from ckptstore.testing.object_store import pytest_configure, registry

__all__ = ["pytest_configure", "registry"]
