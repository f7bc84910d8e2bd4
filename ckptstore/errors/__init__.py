"""Every error ckptstore raises.

Each error derives from :class:`CkptStoreError` and from the built-in exception a
caller would already catch for that situation, so ``except FileNotFoundError`` keeps
working for a missing checkpoint and ``except KeyError`` for a missing blob. Every
message says what to do next.

Example::

    >>> from ckptstore.builtin import LocalPath
    >>> from ckptstore.protocol import require_commit
    >>> try:
    ...     require_commit(LocalPath("ckpt"), 7)
    ... except CheckpointNotFoundError as err:  # also a FileNotFoundError
    ...     print(err.epoch, isinstance(err, FileNotFoundError))
    7 True
"""

from __future__ import annotations

from ckptstore.errors._base import CkptStoreError
from ckptstore.errors._checkpoint import (
    AlreadyCommittedError,
    BlobNotFoundError,
    CatalogCorruptError,
    CheckpointKindError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    MissingDependencyError,
    RestoreMismatchError,
    TooManySaveFailuresError,
    UnsupportedBlobError,
)
from ckptstore.errors._checkpoint import (
    _rebuild_corrupt as _rebuild_corrupt,
)
from ckptstore.errors._configuration import (
    BrokenPluginError,
    DuplicatePluginError,
    FrozenGroupError,
    InvalidEpochError,
    InvalidNameError,
    InvalidPluginError,
    JobConfigurationError,
    NotRunError,
    PluginError,
    UnknownPluginError,
)
from ckptstore.errors._configuration import (
    EnvironmentVariableError as EnvironmentVariableError,
)
from ckptstore.errors._configuration import (
    StorageOptionError as StorageOptionError,
)
from ckptstore.errors._configuration import (
    _rebuild_broken_plugin as _rebuild_broken_plugin,
)
from ckptstore.errors._distributed import (
    LeaseHeldError,
    LeaseLostError,
    NodeLostError,
    TierConflictError,
    TierCopyFailedError,
)
from ckptstore.errors._storage import (
    CREDENTIAL_STATUSES as CREDENTIAL_STATUSES,
)
from ckptstore.errors._storage import (
    DocumentChangedError,
    InProcessMockError,
    KeyExistsError,
    MissingObjectError,
    ObjectNotFoundError,
    RangeNotSatisfiableError,
    RequestError,
    SaveFailedError,
    StorageError,
    StorageFullError,
    StorageIOError,
    StorageNotWritableError,
    is_disk_full,
    is_permanent,
    storage_error,
)

__all__ = [
    "AlreadyCommittedError",
    "BlobNotFoundError",
    "BrokenPluginError",
    "CatalogCorruptError",
    "CheckpointKindError",
    "CheckpointNotFoundError",
    "CkptStoreError",
    "CorruptCheckpointError",
    "DocumentChangedError",
    "DuplicatePluginError",
    "FrozenGroupError",
    "InProcessMockError",
    "InvalidEpochError",
    "InvalidNameError",
    "InvalidPluginError",
    "JobConfigurationError",
    "KeyExistsError",
    "LeaseHeldError",
    "LeaseLostError",
    "MissingDependencyError",
    "MissingObjectError",
    "NodeLostError",
    "NotRunError",
    "ObjectNotFoundError",
    "PluginError",
    "RangeNotSatisfiableError",
    "RequestError",
    "RestoreMismatchError",
    "SaveFailedError",
    "StorageError",
    "StorageFullError",
    "StorageIOError",
    "StorageNotWritableError",
    "TierConflictError",
    "TierCopyFailedError",
    "TooManySaveFailuresError",
    "UnknownPluginError",
    "UnsupportedBlobError",
    "is_disk_full",
    "is_permanent",
    "storage_error",
]


# Each class and function keeps the home it always had, ``ckptstore.errors``: in
# tracebacks, reprs, pickles and doctest output. Only this package knows the split.
for _value in list(globals().values()):
    if getattr(_value, "__module__", "").startswith(f"{__name__}._"):
        _value.__module__ = __name__
del _value
