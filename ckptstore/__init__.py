"""ckptstore: checkpoint ML training state to local disk and object stores.

Caffe2's checkpoint design (Job, JobRunner, CheckpointManager,
MultiNodeCheckpointManager, UploadTaskGroupBuilder, epoch_limiter, db_name) on pluggy
plugins, with atomic commits and checksums.

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

from ckptstore.builtin._catalog import CatalogEntry, IndexCatalog, RebuildReport
from ckptstore.builtin._copy_upload import CopyUpload
from ckptstore.builtin._fsspec_path import FsspecPath
from ckptstore.builtin._json_catalog import JsonCatalog
from ckptstore.builtin._local_path import LocalPath
from ckptstore.builtin._npz_db import NpzDB
from ckptstore.builtin._sqlite_catalog import SqliteCatalog
from ckptstore.builtin._zarr_db import ZarrDB
from ckptstore.checkpoint._async_save import SaveFuture
from ckptstore.checkpoint._manager import CheckpointManager
from ckptstore.checkpoint._multinode import MultiNodeCheckpointManager
from ckptstore.checkpoint._retention import KeepLast, RetentionPolicy
from ckptstore.checkpoint._runner import JobRunner
from ckptstore.errors import (
    AlreadyCommittedError,
    BlobNotFoundError,
    CatalogCorruptError,
    CheckpointKindError,
    CheckpointNotFoundError,
    CkptStoreError,
    CorruptCheckpointError,
    DuplicatePluginError,
    FrozenGroupError,
    InProcessMockError,
    InvalidEpochError,
    InvalidNameError,
    InvalidPluginError,
    JobConfigurationError,
    KeyExistsError,
    LeaseHeldError,
    MissingDependencyError,
    MissingObjectError,
    NodeLostError,
    NotRunError,
    ObjectNotFoundError,
    PluginError,
    RangeNotSatisfiableError,
    RequestError,
    RestoreMismatchError,
    SaveFailedError,
    StorageError,
    StorageFullError,
    StorageIOError,
    StorageNotWritableError,
    TooManySaveFailuresError,
    UnknownPluginError,
    UnsupportedBlobError,
)
from ckptstore.execution._job import Job, epoch_limiter
from ckptstore.execution._node import Node
from ckptstore.execution._session import LocalSession, Session
from ckptstore.execution._task import Task, TaskGroup, TaskOutput, WorkspaceType
from ckptstore.execution._workspace import Workspace
from ckptstore.io._settings import IOSettings
from ckptstore.plugin import get_registry, hookimpl
from ckptstore.plugin._db_type import DBLocation, DBType, WrittenDB
from ckptstore.plugin._metadata import MetadataHandler
from ckptstore.plugin._path_type import PathType
from ckptstore.plugin._upload import UploadTaskGroupBuilder
from ckptstore.records._manifest import BlobRecord, ChunkRecord, NodeManifest
from ckptstore.records._names import db_name, get_ckpt_filename
from ckptstore.records._stats import NodeStats

__version__ = "0.1.0"

__all__ = [
    "AlreadyCommittedError",
    "BlobNotFoundError",
    "BlobRecord",
    "CatalogCorruptError",
    "CatalogEntry",
    "CheckpointKindError",
    "CheckpointManager",
    "CheckpointNotFoundError",
    "ChunkRecord",
    "CkptStoreError",
    "CopyUpload",
    "CorruptCheckpointError",
    "DBLocation",
    "DBType",
    "DuplicatePluginError",
    "FrozenGroupError",
    "FsspecPath",
    "IOSettings",
    "InProcessMockError",
    "IndexCatalog",
    "InvalidEpochError",
    "InvalidNameError",
    "InvalidPluginError",
    "Job",
    "JobConfigurationError",
    "JobRunner",
    "JsonCatalog",
    "KeepLast",
    "KeyExistsError",
    "LeaseHeldError",
    "LocalPath",
    "LocalSession",
    "MetadataHandler",
    "MissingDependencyError",
    "MissingObjectError",
    "MultiNodeCheckpointManager",
    "Node",
    "NodeLostError",
    "NodeManifest",
    "NodeStats",
    "NotRunError",
    "NpzDB",
    "ObjectNotFoundError",
    "PathType",
    "PluginError",
    "RangeNotSatisfiableError",
    "RebuildReport",
    "RequestError",
    "RestoreMismatchError",
    "RetentionPolicy",
    "SaveFailedError",
    "SaveFuture",
    "Session",
    "SqliteCatalog",
    "StorageError",
    "StorageFullError",
    "StorageIOError",
    "StorageNotWritableError",
    "Task",
    "TaskGroup",
    "TaskOutput",
    "TooManySaveFailuresError",
    "UnknownPluginError",
    "UnsupportedBlobError",
    "UploadTaskGroupBuilder",
    "Workspace",
    "WorkspaceType",
    "WrittenDB",
    "ZarrDB",
    "__version__",
    "db_name",
    "epoch_limiter",
    "get_ckpt_filename",
    "get_registry",
    "hookimpl",
]


def __getattr__(name: str) -> object:
    """``ckptstore.DaskSession``, imported only when asked for (it needs Dask, the
    ``dask`` extra: ``pip install 'distributed>=2024.8'``)."""
    if name == "DaskSession":
        from ckptstore.dask_session import DaskSession

        return DaskSession
    raise AttributeError(f"module 'ckptstore' has no attribute {name!r}")
