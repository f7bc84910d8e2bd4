"""Registers the ``gcs`` path type with ckptstore (entry point ``ckptstore`` group)."""

from __future__ import annotations

from ckptstore.plugin import PathType, hookimpl
from ckptstore_gcs.path import GCSPath

__all__ = ["ckptstore_path_types"]


@hookimpl
def ckptstore_path_types() -> list[type[PathType]]:
    return [GCSPath]
