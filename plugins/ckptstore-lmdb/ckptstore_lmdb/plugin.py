"""The plugin module registered under the ``ckptstore`` entry-point group as ``lmdb``."""

from __future__ import annotations

from ckptstore.db_type import DBType
from ckptstore.plugin.markers import hookimpl
from ckptstore_lmdb.db import LmdbDB

__all__ = ["ckptstore_db_types"]


@hookimpl
def ckptstore_db_types() -> list[type[DBType]]:
    """The ``lmdb`` DB type."""
    return [LmdbDB]
