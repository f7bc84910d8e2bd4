"""ckptstore's built-in plugins that sit above :mod:`ckptstore.checkpoint`: the ``json``
and ``sqlite`` catalogs (metadata handlers) and the ``copy`` upload builder. Each module
is an ordinary plugin, registered from ``BUILTIN_PLUGINS`` in :mod:`ckptstore.plugin`.

The built-in formats and path types, which the checkpoint layer uses, live below it in
:mod:`ckptstore.formats` and :mod:`ckptstore.paths`; their names are still importable
from here (``from ckptstore.builtin import LocalPath``).
"""

from ckptstore.builtin._catalog import CatalogEntry, IndexCatalog, RebuildReport
from ckptstore.builtin._copy_upload import CopyUpload
from ckptstore.builtin._json_catalog import CATALOG_DIR, LEGACY_CATALOG_KEY, JsonCatalog
from ckptstore.builtin._sqlite_catalog import DATABASE_ENV, DEFAULT_NAME, SqliteCatalog
from ckptstore.formats import NpzDB, ZarrDB
from ckptstore.paths import FsspecPath, LocalPath

__all__ = [
    "CATALOG_DIR",
    "DATABASE_ENV",
    "DEFAULT_NAME",
    "LEGACY_CATALOG_KEY",
    "CatalogEntry",
    "CopyUpload",
    "FsspecPath",
    "IndexCatalog",
    "JsonCatalog",
    "LocalPath",
    "NpzDB",
    "RebuildReport",
    "SqliteCatalog",
    "ZarrDB",
]
