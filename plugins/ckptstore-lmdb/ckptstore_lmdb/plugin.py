"""The plugin module registered under the ``ckptstore`` entry-point group as ``lmdb``."""

from __future__ import annotations

from ckptstore.plugin import DBType, hookimpl
from ckptstore_lmdb.db import LmdbDB

__all__ = ["ckptstore_db_types"]


@hookimpl
def ckptstore_db_types() -> list[type[DBType]]:
    """The ``lmdb`` DB type."""
    return [LmdbDB]
