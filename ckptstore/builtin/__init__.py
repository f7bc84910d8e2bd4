"""ckptstore's built-in plugins. Each module is an ordinary plugin (its hooks are found
like any installed plugin's), registered from ``BUILTIN_PLUGINS`` in
:mod:`ckptstore.plugin._registry`."""

from ckptstore.builtin._catalog import CatalogEntry, IndexCatalog, RebuildReport
from ckptstore.builtin._copy_upload import CopyUpload
from ckptstore.builtin._fsspec_path import FsspecPath
from ckptstore.builtin._json_catalog import CATALOG_DIR, LEGACY_CATALOG_KEY, JsonCatalog
from ckptstore.builtin._local_path import LocalPath
from ckptstore.builtin._npz_db import NpzDB
from ckptstore.builtin._sqlite_catalog import DATABASE_ENV, DEFAULT_NAME, SqliteCatalog
from ckptstore.builtin._zarr_db import ZarrDB

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
