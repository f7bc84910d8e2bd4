"""The built-in DB types (checkpoint formats): ``zarr`` and ``npz``, both written as
ZIP archives laid out ahead and filled in parallel by the packer.

Each format module is an ordinary plugin (its hooks are found like any installed
plugin's), registered from ``BUILTIN_PLUGINS`` in :mod:`ckptstore.plugin`. Sits below
:mod:`ckptstore.checkpoint`, which uses the formats; may import :mod:`ckptstore.plugin`,
:mod:`ckptstore.records`, :mod:`ckptstore.io` and :mod:`ckptstore.errors`.

Example::

    >>> from ckptstore.formats import NpzDB, ZarrDB
    >>> NpzDB.name, ZarrDB.name
    ('npz', 'zarr')
"""

from ckptstore.formats._npz_db import NpzDB
from ckptstore.formats._packed import check_ranges
from ckptstore.formats._zarr_db import ARCHIVE, ZarrDB

__all__ = ["ARCHIVE", "NpzDB", "ZarrDB", "check_ranges"]
