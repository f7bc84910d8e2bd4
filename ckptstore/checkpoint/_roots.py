"""A manager's checkpoint roots, opened: the first as a location with the manager's own
options, the later ones (tiers) as upload builders that copy each committed epoch.

Example::

    >>> location, later = open_roots(
    ...     ["fast", "durable"], db_type="npz", io=None, path_type=None,
    ...     storage_options=None, incremental=False,
    ... )
    >>> location.db_type.name, len(later)
    ('npz', 1)
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace

from ckptstore.checkpoint._tiers import RootLike, split_roots
from ckptstore.io import IOSettings
from ckptstore.plugin import DBType, UploadTaskGroupBuilder
from ckptstore.protocol import CheckpointLocation, check_frozen, check_incremental

__all__ = ["open_roots"]


def open_roots(
    db_prefix: str | Sequence[RootLike],
    *,
    db_type: str | DBType,
    io: IOSettings | None,
    path_type: str | None,
    storage_options: Mapping[str, object] | None,
    incremental: bool,
    location: CheckpointLocation | None = None,
    frozen: Collection[str] = (),
) -> tuple[CheckpointLocation, list[UploadTaskGroupBuilder]]:
    """A manager's roots: the first opened with the manager's own options (or
    ``location``, made incremental and given ``frozen`` if asked), the later ones as
    upload builders."""
    if location is not None and incremental and not location.incremental:
        check_incremental(location.db_type)
        location = replace(location, incremental=True)
    if location is not None and frozen:
        check_frozen(frozen, incremental=location.incremental)
        location = replace(location, frozen=frozenset(frozen))
    roots: Sequence[RootLike] = [db_prefix] if isinstance(db_prefix, str) else db_prefix

    def open_first(prefix: str) -> CheckpointLocation:
        return CheckpointLocation.open(
            prefix,
            db_type,
            io=io,
            path_type=path_type,
            storage_options=storage_options,
            incremental=incremental,
            frozen=frozen,
        )

    given: list[RootLike] = list(roots)
    if location is not None:
        given[:1] = [location]  # the opened first root stands for the URL
    return split_roots(given, open_first)
