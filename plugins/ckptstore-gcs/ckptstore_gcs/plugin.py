"""Registers the ``gcs`` path type with ckptstore (entry point ``ckptstore`` group)."""

from __future__ import annotations

from ckptstore.path_type import PathType
from ckptstore.plugin.markers import hookimpl
from ckptstore_gcs.path import GCSPath

__all__ = ["ckptstore_path_types"]


@hookimpl
def ckptstore_path_types() -> list[type[PathType]]:
    return [GCSPath]
