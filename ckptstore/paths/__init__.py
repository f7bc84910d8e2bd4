"""The built-in path types (where checkpoints are stored): ``local`` (a directory, with
``O_DIRECT`` writes and no link followed) and ``fsspec`` (any fsspec file system).

Each path type module is an ordinary plugin (its hooks are found like any installed
plugin's), registered from ``BUILTIN_PLUGINS`` in :mod:`ckptstore.plugin`. Sits below
:mod:`ckptstore.checkpoint`, which uses the paths; may import :mod:`ckptstore.plugin`,
:mod:`ckptstore.records`, :mod:`ckptstore.io` and :mod:`ckptstore.errors`.

Example::

    >>> from ckptstore.paths import FsspecPath, LocalPath
    >>> LocalPath.name, FsspecPath.name
    ('local', 'fsspec')
"""

from ckptstore.paths._fsspec_path import FsspecPath
from ckptstore.paths._local_path import LocalPath

__all__ = ["FsspecPath", "LocalPath"]
