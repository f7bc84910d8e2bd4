"""The hooks a ckptstore plugin can implement. Every hook is optional.

The four registration hooks return classes; each class names itself with a ``name``
attribute (path types also list the URL ``protocols`` they serve). Two plugins claiming
one name is an error. ``ckptstore_report`` is a broadcast: every implementation hears
every report.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from ckptstore.plugin._markers import hookspec

if TYPE_CHECKING:
    from ckptstore.plugin._db_type import DBType
    from ckptstore.plugin._metadata import MetadataHandler
    from ckptstore.plugin._path_type import PathType
    from ckptstore.plugin._upload import UploadTaskGroupBuilder
    from ckptstore.records import NodeStats


@hookspec
def ckptstore_db_types() -> Sequence[type[DBType]]:  # type: ignore[empty-body]
    """Checkpoint formats this plugin provides (subclasses of
    :class:`ckptstore.plugin.DBType`), selected by ``db_type="<name>"``."""


@hookspec
def ckptstore_path_types() -> Sequence[type[PathType]]:  # type: ignore[empty-body]
    """Storage back ends this plugin provides (subclasses of :class:`ckptstore.plugin.PathType`),
    selected by the ``protocols`` of a checkpoint URL (``s3://...``)."""


@hookspec
def ckptstore_metadata_handlers() -> Sequence[type[MetadataHandler]]:  # type: ignore[empty-body]
    """Metadata handlers this plugin provides (subclasses of
    :class:`ckptstore.plugin.MetadataHandler`), selected by ``metadata_handler="<name>"``."""


@hookspec
def ckptstore_upload_builders() -> Sequence[type[UploadTaskGroupBuilder]]:  # type: ignore[empty-body]
    """Upload builders this plugin provides (subclasses of
    :class:`ckptstore.UploadTaskGroupBuilder`), selected by name."""


@hookspec
def ckptstore_report(action_name: str, stats: Mapping[str, NodeStats]) -> None:
    """Observe a finished checkpoint operation.

    :param action_name: ``"checkpoint_save"``, ``"checkpoint_load"``,
        ``"checkpoint_partial_load"``, ``"checkpoint_save_failed"``,
        ``"checkpoint_load_failed"`` or ``"checkpoint_upload"``.
    :param stats: maps each node checkpoint's path to its :class:`ckptstore.records.NodeStats`.
    """
