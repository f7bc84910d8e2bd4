"""The checkpoint API: Caffe2's ``CheckpointManager``, ``MultiNodeCheckpointManager`` and
``JobRunner``, the tasks they run on each node, and retention policies.

Owns when to save, load and resume. Asks :mod:`ckptstore.protocol` what is committed and
never parses stored documents itself. May import the protocol and every layer below it
(:mod:`ckptstore.plugin`, :mod:`ckptstore.execution`, :mod:`ckptstore.records`,
:mod:`ckptstore.io`); never the built-ins, the tools or the CLI.

Example::

    manager = MultiNodeCheckpointManager("/ckpt", "zarr", metadata_handler="json")
    JobRunner(job, manager).train(LocalSession())
"""

from ckptstore.checkpoint._async_save import SaveFuture
from ckptstore.checkpoint._manager import (
    DEFAULT_DB_TYPE,
    CheckpointManager,
    ManagerBase,
)
from ckptstore.checkpoint._multinode import MultiNodeCheckpointManager
from ckptstore.checkpoint._retention import KeepLast, RetentionPolicy
from ckptstore.checkpoint._runner import JobRunner, SaveFailure

__all__ = [
    "DEFAULT_DB_TYPE",
    "CheckpointManager",
    "JobRunner",
    "KeepLast",
    "ManagerBase",
    "MultiNodeCheckpointManager",
    "RetentionPolicy",
    "SaveFailure",
    "SaveFuture",
]
