"""The checkpoint API: Caffe2's ``CheckpointManager``, ``MultiNodeCheckpointManager`` and
``JobRunner``, the tasks they run on each node, and retention policies.

Owns when to save, load and resume. Asks :mod:`ckptstore.protocol` what is committed and
never parses stored documents itself. May import the protocol and every layer below it
(:mod:`ckptstore.plugin`, :mod:`ckptstore.execution`, :mod:`ckptstore.records`,
:mod:`ckptstore.io`); never the built-ins, the tools or the CLI.

Example::

    >>> from ckptstore import Job, Node, Task, epoch_limiter
    >>> with Job() as job:
    ...     for name in ("trainer_0", "trainer_1"):
    ...         with Node(name):
    ...             with job.init_group:
    ...                 _ = Task(lambda ws: ws.update(w=np.zeros(2)))
    ...             _ = Task(lambda ws: ws["w"].__iadd__(1))
    ...     with Node("trainer_0"):
    ...         done = epoch_limiter(job, 3)
    >>> from ckptstore import JobRunner, LocalSession, MultiNodeCheckpointManager
    >>> manager = MultiNodeCheckpointManager("ckpt", "zarr", metadata_handler="json")
    >>> JobRunner(job, manager).train(LocalSession())
    3
"""

from ckptstore.checkpoint._async_save import SaveFuture
from ckptstore.checkpoint._manager import (
    DEFAULT_DB_TYPE,
    CheckpointManager,
    ManagerBase,
)
from ckptstore.checkpoint._multinode import MultiNodeCheckpointManager
from ckptstore.checkpoint._node_tasks import commit_saves, list_blob_names
from ckptstore.checkpoint._peer_copies import PEER_COPIES
from ckptstore.checkpoint._retention import KeepLast, RetentionPolicy, carry_out, plan_retention
from ckptstore.checkpoint._runner import JobRunner, SaveFailure
from ckptstore.checkpoint._tiers import RootLike, Tiers, first_serving

__all__ = [
    "DEFAULT_DB_TYPE",
    "PEER_COPIES",
    "CheckpointManager",
    "JobRunner",
    "KeepLast",
    "ManagerBase",
    "MultiNodeCheckpointManager",
    "RetentionPolicy",
    "RootLike",
    "SaveFailure",
    "SaveFuture",
    "Tiers",
    "carry_out",
    "commit_saves",
    "first_serving",
    "list_blob_names",
    "plan_retention",
]
