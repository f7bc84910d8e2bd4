"""ckptstore: checkpoint ML training state to local disk and object stores.

Caffe2's checkpoint design (Job, JobRunner, CheckpointManager,
MultiNodeCheckpointManager, UploadTaskGroupBuilder, epoch_limiter, db_name) on pluggy
plugins, with atomic commits and checksums.

This module holds what a training script writes. Plugin authors import from
:mod:`ckptstore.plugin`, every error is in :mod:`ckptstore.errors`, and the built-in
formats, paths and catalogs are in :mod:`ckptstore.builtin`.

Example::

    >>> from ckptstore import (Job, JobRunner, LocalSession, MultiNodeCheckpointManager,
    ...                        Node, Task, epoch_limiter)
    >>> with Job() as job, Node("trainer_0"):
    ...     with job.init_group:
    ...         _ = Task(lambda ws: ws.update(w=np.zeros(10)), name="init")
    ...     _ = Task(lambda ws: ws["w"].__iadd__(1.0), name="train")
    ...     done = epoch_limiter(job, 5)
    >>> manager = MultiNodeCheckpointManager("./ckpt", "npz", metadata_handler="json")
    >>> JobRunner(job, manager).train(LocalSession())
    5
    >>> rerun = JobRunner(job, manager)  # run again: epoch 5 is restored, none runs
    >>> rerun.train(LocalSession()), rerun.already_finished
    (5, True)
"""

import importlib
import warnings

from ckptstore.checkpoint import (
    CheckpointManager,
    JobRunner,
    KeepLast,
    MultiNodeCheckpointManager,
    RetentionPolicy,
    SaveFuture,
)
from ckptstore.errors import (
    AlreadyCommittedError,
    CheckpointNotFoundError,
    CkptStoreError,
    CorruptCheckpointError,
    JobConfigurationError,
    LeaseHeldError,
    LeaseLostError,
    SaveFailedError,
    StorageError,
)
from ckptstore.execution import (
    Job,
    LocalSession,
    Node,
    Session,
    Task,
    TaskGroup,
    Workspace,
    epoch_limiter,
)
from ckptstore.io import IOSettings
from ckptstore.plugin import UploadTaskGroupBuilder
from ckptstore.records import db_name, get_ckpt_filename

__version__ = "0.1.0"

__all__ = [
    "AlreadyCommittedError",
    "CheckpointManager",
    "CheckpointNotFoundError",
    "CkptStoreError",
    "CorruptCheckpointError",
    "IOSettings",
    "Job",
    "JobConfigurationError",
    "JobRunner",
    "KeepLast",
    "LeaseHeldError",
    "LeaseLostError",
    "LocalSession",
    "MultiNodeCheckpointManager",
    "Node",
    "RetentionPolicy",
    "SaveFailedError",
    "SaveFuture",
    "Session",
    "StorageError",
    "Task",
    "TaskGroup",
    "UploadTaskGroupBuilder",
    "Workspace",
    "__version__",
    "db_name",
    "epoch_limiter",
    "get_ckpt_filename",
]

_HOMES = (
    "ckptstore.builtin",
    "ckptstore.plugin",
    "ckptstore.errors",
    "ckptstore.records",
    "ckptstore.execution",
)
"""Where the names ``ckptstore`` exported before its front door narrowed live now
(built-in classes, plugin contracts, errors, records, execution types)."""


def _home(name: str) -> str | None:
    for module in _HOMES:
        if name in importlib.import_module(module).__all__:
            return module
    return None


def __getattr__(name: str) -> object:
    """``ckptstore.DaskSession`` (imported only when asked for: it needs Dask, the
    ``dask`` extra), and the names that moved to a subpackage, with a warning."""
    if name == "DaskSession":
        from ckptstore.dask_session import DaskSession

        return DaskSession
    home = _home(name)
    if home is None:
        raise AttributeError(f"module 'ckptstore' has no attribute {name!r}")
    warnings.warn(
        f"ckptstore.{name} moved: import it as `from {home} import {name}` "
        "(the old name goes away in the next release)",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(home), name)
