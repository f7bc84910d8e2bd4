"""Errors of jobs that share storage or run on several workers: tiers, writer leases
and lost nodes."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ckptstore.errors._base import CkptStoreError
from ckptstore.errors._checkpoint import AlreadyCommittedError
from ckptstore.errors._storage import SaveFailedError


class TierConflictError(AlreadyCommittedError):
    """A later checkpoint root (a tier) already holds another checkpoint of the epoch a
    background copy was taking there: a second job writes to the same later root (the
    writer lease guards only the first root). Nothing was overwritten.

    Example::

        >>> err = TierConflictError("s3://bucket/run", 3, ["trainer_0"])
        >>> err.url, isinstance(err, FileExistsError)
        ('s3://bucket/run', True)
    """

    def __init__(self, url: str, epoch: int, nodes: Iterable[str]) -> None:
        super().__init__(url, epoch, nodes)
        CkptStoreError.__init__(
            self,
            f"epoch {epoch} of node(s) {list(self.nodes)} under {url} is another checkpoint "
            "than the one committed on the first root (its manifest differs): another job "
            "writes to this root, or this job replaced the epoch (overwrite=True); nothing "
            "there was overwritten. Give each job its own later roots.",
        )


class LeaseHeldError(CkptStoreError, RuntimeError):
    """Another job holds the writer lease of a node under this prefix.

    ``holder`` describes it (host, pid, start time, expiry).

    Example::

        >>> from ckptstore.builtin import LocalPath
        >>> from ckptstore.protocol import WriterLease
        >>> storage = LocalPath("leased")
        >>> with WriterLease(storage, ["trainer_0"]):
        ...     try:
        ...         WriterLease(storage, ["trainer_0"]).acquire()  # a second job
        ...     except LeaseHeldError as err:
        ...         print(err.node, "held by", err.holder)
        trainer_0 held by host ...
    """

    def __init__(self, url: str, node: str, holder: str, expires_in: float) -> None:
        self.url = url
        self.node = node
        self.holder = holder
        self.expires_in = expires_in
        CkptStoreError.__init__(
            self,
            f"node {node!r} under {url} is being written by another job ({holder}); two "
            "writers of one node would interleave their checkpoints. Stop that job, give this "
            "one another prefix or node name, or wait: the lease expires in "
            f"{max(expires_in, 0.0):.0f} s if that job is gone.",
        )


class LeaseLostError(CkptStoreError, RuntimeError):
    """This job lost a node's writer lease, so it commits nothing more.

    Another job took the lease over (this one was silent for longer than the lease's
    ttl), or an operator broke it (``ckptstore lease break``). :meth:`JobRunner.train`
    raises it.

    Example::

        >>> from ckptstore.builtin import LocalPath
        >>> from ckptstore.protocol import WriterLease, break_lease
        >>> storage = LocalPath("broken")
        >>> with WriterLease(storage, ["trainer_0"]) as lease:
        ...     _ = break_lease(storage, "trainer_0")  # an operator, from elsewhere
        ...     try:
        ...         lease.verify()
        ...     except LeaseLostError as err:
        ...         print(err.node, err.generation)
        trainer_0 1
    """

    def __init__(self, url: str, node: str, generation: int, reason: str) -> None:
        self.url = url
        self.node = node
        self.generation = generation
        self.reason = reason
        CkptStoreError.__init__(
            self,
            f"this job lost the writer lease of node {node!r} under {url} (generation "
            f"{generation}): {reason}. It commits nothing more; the job now holding the lease "
            "writes this node. Check `ckptstore lease show` before restarting this one.",
        )


class TierCopyFailedError(SaveFailedError):
    """A later checkpoint root (a tier) did not receive an epoch committed on the first
    root: the copy failed after its retries. The epoch stays committed on the first
    root; a resume finds it there.

    Example::

        >>> err = TierCopyFailedError(3, "s3://bucket/run", {"trainer_0": "timed out"})
        >>> err.url, isinstance(err, OSError)
        ('s3://bucket/run', True)
    """

    def __init__(self, epoch: int, url: str, node_errors: Mapping[str, str]) -> None:
        super().__init__(epoch, url, node_errors)
        causes = "; ".join(f"node {node!r}: {error}" for node, error in self.node_errors.items())
        self.args = (
            f"epoch {epoch} was not copied to {url} ({causes}); it is committed on the first "
            "root. Check that this root can be written; the next run copies it again.",
        )


class NodeLostError(CkptStoreError, RuntimeError):
    """A node's in-memory workspace is gone: the worker holding it died or restarted.

    Example::

        >>> err = NodeLostError("trainer_1", "tcp://10.0.0.2:4000", "the worker died")
        >>> err.node, err.worker
        ('trainer_1', 'tcp://10.0.0.2:4000')
    """

    def __init__(self, node: str, worker: str, detail: str) -> None:
        self.node = node
        self.worker = worker
        self.detail = detail
        super().__init__(
            f"node {node!r} lost its workspace: {detail} (worker {worker}). Its in-memory state "
            "cannot be recovered; close this session and re-run the job in a new one: it "
            "resumes from the last epoch committed on all nodes."
        )

    def __reduce__(self) -> tuple[type[NodeLostError], tuple[str, str, str], dict[str, object]]:
        return type(self), (self.node, self.worker, self.detail), dict(self.__dict__)
