"""Registers the ``s3`` path type with ckptstore (entry point ``ckptstore`` group)."""

from __future__ import annotations

from ckptstore.plugin import PathType, hookimpl
from ckptstore_s3.path import S3Path

__all__ = ["ckptstore_path_types"]


@hookimpl
def ckptstore_path_types() -> list[type[PathType]]:
    return [S3Path]
