"""What one checkpoint operation on one node did: reported to metadata handlers and to
every plugin's ``ckptstore_report`` hook.

Example::

    >>> stats = {"/ckpt/trainer_0.3": NodeStats("trainer_0", 3, "/ckpt/trainer_0.3",
    ...                                         "checkpoint_save", duration_ns=12_000_000)}
    >>> stats["/ckpt/trainer_0.3"].action
    'checkpoint_save'
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ckptstore.records._commit_record import NodeCommit

__all__ = ["ACTIONS", "NodeStats"]

ACTIONS = (
    "checkpoint_save",
    "checkpoint_load",
    "checkpoint_partial_load",
    "checkpoint_save_failed",
    "checkpoint_load_failed",
    "checkpoint_upload",
)
"""The action names reports carry (Caffe2's three, plus failures and uploads)."""


@dataclass(frozen=True)
class NodeStats:
    """One node's part of a checkpoint operation.

    ``db_path`` is the node checkpoint's location (credentials removed); ``nbytes`` the
    blob bytes moved; ``stored_bytes`` what is on storage; ``error`` is set for failures.

    Example::

        >>> stats = {"/ckpt/trainer_0.3": NodeStats("trainer_0", 3, "/ckpt/trainer_0.3",
        ...          "checkpoint_save", duration_ns=500_000_000, nbytes=1 << 30)}
        >>> for path, node_stats in stats.items():
        ...     print(node_stats.node, node_stats.duration_ns / 1e6, "ms",
        ...           node_stats.throughput / 2**30, "GiB/s")
        trainer_0 500.0 ms 2.0 GiB/s
    """

    node: str
    epoch: int
    db_path: str
    action: str
    duration_ns: int = 0
    nbytes: int = 0
    stored_bytes: int = 0
    nblobs: int = 0
    blobs: tuple[str, ...] = ()
    error: str | None = None
    commit: NodeCommit | None = field(default=None, repr=False, compare=False)
    cause: BaseException | None = field(default=None, repr=False, compare=False)
    """The error behind ``error``, in the process that met it (not pickled: it may not
    survive the trip, and ``error`` says what it was)."""

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "cause": None}

    @property
    def throughput(self) -> float:
        """Blob bytes per second (0 when nothing was timed)."""
        return self.nbytes / (self.duration_ns / 1e9) if self.duration_ns else 0.0
