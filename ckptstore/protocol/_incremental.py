"""Whether a DB type can save incrementally (docs/design.md, "Incremental checkpoints")."""

from __future__ import annotations

from collections.abc import Collection

from ckptstore.errors import JobConfigurationError
from ckptstore.plugin import DBType

__all__ = ["check_frozen", "check_incremental"]


def check_incremental(db_type: DBType) -> None:
    """Raise :class:`~ckptstore.errors.JobConfigurationError` unless ``db_type`` can
    save incrementally (its large blobs in the root's chunk store)."""
    if not getattr(db_type, "supports_incremental", False):
        raise JobConfigurationError(
            f"DB type {db_type.name!r} cannot save incrementally (incremental=True): its "
            "blobs cannot refer to chunks outside its own files. Use db_type='zarr' "
            "(uncompressed) or 'npz', or save with incremental=False"
        )


def check_frozen(frozen: Collection[str], *, incremental: bool) -> None:
    """Raise :class:`~ckptstore.errors.JobConfigurationError` for ``frozen`` names
    without ``incremental`` (only an incremental save reuses chunks)."""
    if frozen and not incremental:
        raise JobConfigurationError(
            "frozen= needs incremental=True (only an incremental save reuses chunks)"
        )
