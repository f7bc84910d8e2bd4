"""Whether a DB type can save incrementally (docs/design.md, "Incremental checkpoints")."""

from __future__ import annotations

from ckptstore.errors import JobConfigurationError
from ckptstore.plugin import DBType

__all__ = ["check_incremental"]


def check_incremental(db_type: DBType) -> None:
    """Raise :class:`~ckptstore.errors.JobConfigurationError` unless ``db_type`` can
    save incrementally (its large blobs in the root's chunk store)."""
    if not getattr(db_type, "supports_incremental", False):
        raise JobConfigurationError(
            f"DB type {db_type.name!r} cannot save incrementally (incremental=True): its "
            "blobs cannot refer to chunks outside its own files. Use db_type='zarr' "
            "(uncompressed) or 'npz', or save with incremental=False"
        )
