"""ckptstore's plugin system, built on pluggy.

Owns the extension points: the hook specifications, the abstract contracts a plugin
implements (DB types, path types, metadata handlers, upload builders) and the registry
that gathers installed plugins. May import :mod:`ckptstore.execution`,
:mod:`ckptstore.records`, :mod:`ckptstore.io` and :mod:`ckptstore.errors`; the built-in
plugins are loaded by module name, never imported here.

Plugins are modules or objects with functions marked ``@hookimpl``; installed
distributions register them under the ``ckptstore`` entry-point group. The hooks are
specified in :mod:`ckptstore.plugin._spec`; the plugin authors' guide is
``docs/plugins.md``.

Example (a plugin module listing its DB types; ``MyFormat`` subclasses :class:`DBType`)::

    >>> from ckptstore.builtin import NpzDB
    >>> from ckptstore.plugin import hookimpl
    >>> class MyFormat(NpzDB):
    ...     name = "myformat"
    >>> @hookimpl
    ... def ckptstore_db_types():
    ...     return [MyFormat]
"""

from ckptstore.plugin._coalesce import Span, coalesced_reads
from ckptstore.plugin._db_type import DBLocation, DBType, WrittenDB, read_raw_blobs, verify_records
from ckptstore.plugin._markers import PROJECT_NAME, hookimpl, hookspec
from ckptstore.plugin._metadata import Caffe2Handler, MetadataHandler, MetadataHandlerLike
from ckptstore.plugin._path_type import (
    CONTENT_VERSION,
    PathType,
    PositionalReader,
    PositionalWriter,
    content_version,
    redact_url,
)
from ckptstore.plugin._registry import PluginInfo, Registry, get_registry, reset_registry
from ckptstore.plugin._upload import CheckpointRoot, UploadSource, UploadTaskGroupBuilder

__all__ = [
    "CONTENT_VERSION",
    "PROJECT_NAME",
    "Caffe2Handler",
    "CheckpointRoot",
    "DBLocation",
    "DBType",
    "MetadataHandler",
    "MetadataHandlerLike",
    "PathType",
    "PluginInfo",
    "PositionalReader",
    "PositionalWriter",
    "Registry",
    "Span",
    "UploadSource",
    "UploadTaskGroupBuilder",
    "WrittenDB",
    "coalesced_reads",
    "content_version",
    "get_registry",
    "hookimpl",
    "hookspec",
    "read_raw_blobs",
    "redact_url",
    "reset_registry",
    "verify_records",
]
