"""ckptstore: checkpoint ML training state to local disk and object stores.

Caffe2's checkpoint design (Job, JobRunner, CheckpointManager,
MultiNodeCheckpointManager, UploadTaskGroupBuilder, epoch_limiter, db_name) on pluggy
plugins, with atomic commits and checksums.

Example::

    from ckptstore import (Job, JobRunner, LocalSession, MultiNodeCheckpointManager,
                           Node, Task, epoch_limiter)

    with Job() as job, Node("trainer_0"):
        with job.init_group:
            Task(lambda ws: ws.update(w=np.zeros(10)), name="init")
        Task(lambda ws: ws["w"].__iadd__(1.0), name="train")
    epoch_limiter(job, 5)
    manager = MultiNodeCheckpointManager("./ckpt", "npz", metadata_handler="json")
    JobRunner(job, manager).train(LocalSession())   # run again: resumes by itself
"""

from ckptstore.builtin.copy_upload import CopyUpload
from ckptstore.builtin.fsspec_path import FsspecPath
from ckptstore.builtin.json_catalog import JsonCatalog
from ckptstore.builtin.local_path import LocalPath
from ckptstore.builtin.npz_db import NpzDB
from ckptstore.builtin.sqlite_catalog import SqliteCatalog
from ckptstore.builtin.zarr_db import ZarrDB
from ckptstore.db_type import DBLocation, DBType, WrittenDB
from ckptstore.errors import (
    BlobNotFoundError,
    CheckpointNotFoundError,
    CkptStoreError,
    CorruptCheckpointError,
    DuplicatePluginError,
    InvalidNameError,
    JobConfigurationError,
    NodeLostError,
    SaveFailedError,
    StorageError,
    TooManySaveFailuresError,
    UnknownPluginError,
    UnsupportedBlobError,
)
from ckptstore.io.settings import IOSettings
from ckptstore.job import Job, epoch_limiter
from ckptstore.manager import CheckpointManager
from ckptstore.manifest import BlobRecord, ChunkRecord, NodeManifest
from ckptstore.metadata import MetadataHandler
from ckptstore.multinode import MultiNodeCheckpointManager
from ckptstore.names import db_name, get_ckpt_filename
from ckptstore.node import Node
from ckptstore.path_type import PathType
from ckptstore.plugin import get_registry, hookimpl
from ckptstore.retention import KeepLast, RetentionPolicy
from ckptstore.runner import JobRunner
from ckptstore.session import LocalSession, Session
from ckptstore.stats import NodeStats
from ckptstore.task import Task, TaskGroup, TaskOutput, WorkspaceType
from ckptstore.upload import UploadTaskGroupBuilder
from ckptstore.workspace import Workspace

__version__ = "0.1.0"

__all__ = [
    "BlobNotFoundError",
    "BlobRecord",
    "CheckpointManager",
    "CheckpointNotFoundError",
    "ChunkRecord",
    "CkptStoreError",
    "CopyUpload",
    "CorruptCheckpointError",
    "DBLocation",
    "DBType",
    "DuplicatePluginError",
    "FsspecPath",
    "IOSettings",
    "InvalidNameError",
    "Job",
    "JobConfigurationError",
    "JobRunner",
    "JsonCatalog",
    "KeepLast",
    "LocalPath",
    "LocalSession",
    "MetadataHandler",
    "MultiNodeCheckpointManager",
    "Node",
    "NodeLostError",
    "NodeManifest",
    "NodeStats",
    "NpzDB",
    "PathType",
    "RetentionPolicy",
    "SaveFailedError",
    "Session",
    "SqliteCatalog",
    "StorageError",
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
