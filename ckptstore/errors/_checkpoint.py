"""Errors about what is checkpointed: blobs, restores, missing, corrupt or already
committed checkpoints, catalogs, and a job stopped by failed saves."""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Sequence
from typing import Any

from ckptstore.errors._base import CkptStoreError


class UnsupportedBlobError(CkptStoreError, TypeError):
    """A blob cannot be checkpointed safely (object arrays, structured dtypes...).

    Example::

        >>> from ckptstore import Workspace
        >>> Workspace()["names"] = np.array(["a", None], dtype=object)
        Traceback (most recent call last):
        ckptstore.errors.UnsupportedBlobError: ...
    """

    def __init__(self, blob: str, reason: str) -> None:
        self.blob = blob
        self.reason = reason
        super().__init__(f"blob {blob!r} cannot be checkpointed: {reason}.")


class MissingDependencyError(UnsupportedBlobError):
    """A stored blob needs an optional package that is not installed (ml_dtypes for
    bfloat16 and float8): the checkpoint is intact, this environment cannot read it.

    Example::

        >>> err = MissingDependencyError("w", "it needs ml_dtypes: `pip install ml_dtypes`")
        >>> err.blob, isinstance(err, UnsupportedBlobError)
        ('w', True)
    """


class BlobNotFoundError(CkptStoreError, KeyError):
    """A requested blob is neither in the workspace nor in any checkpoint searched.

    Example::

        >>> from ckptstore import Workspace
        >>> try:
        ...     Workspace()["w"]
        ... except BlobNotFoundError as err:  # also a KeyError
        ...     print(err.blobs)
        ('w',)
    """

    def __init__(self, blobs: Iterable[str], where: str, fix: str) -> None:
        self.blobs = tuple(blobs)
        super().__init__(f"blob(s) {', '.join(map(repr, self.blobs))} not found in {where}; {fix}.")


class RestoreMismatchError(CkptStoreError, ValueError):
    """A stored tensor does not fit the object it would be restored into: another shape
    or dtype (a model whose layer changed size since the save). Raised before any object
    is changed; nothing is wrong with the checkpoint.

    Example::

        >>> err = RestoreMismatchError("model/weight", "shape (2, 2)", "shape (2, 3)")
        >>> err.tensor, isinstance(err, ValueError)
        ('model/weight', True)
    """

    def __init__(self, tensor: str, stored: str, current: str) -> None:
        self.tensor = tensor
        self.stored = stored
        self.current = current
        super().__init__(
            f"cannot restore tensor {tensor!r}: the checkpoint holds {stored}, the object "
            f"restored into has {current}; nothing was changed. Build the object as it was "
            "when saved (or convert it), or read the state with load_state and adapt it."
        )


class CheckpointNotFoundError(CkptStoreError, FileNotFoundError):
    """No committed checkpoint exists for that node and epoch.

    Example::

        >>> err = CheckpointNotFoundError("/ckpt", "trainer_0", 7, "epoch 7 is not committed")
        >>> err.url, err.node, err.epoch
        ('/ckpt', 'trainer_0', 7)
    """

    def __init__(self, url: str, node: str | None, epoch: int | None, detail: str) -> None:
        self.url = url
        self.node = node
        self.epoch = epoch
        super().__init__(detail)


class CheckpointKindError(CkptStoreError, ValueError):
    """A committed checkpoint was read with an API for another kind of checkpoint (a
    Job's node checkpoint with ``load_tree``, a tree that is not a dict of states with
    ``ckptstore.torch``). The checkpoint is intact: read it with the API that wrote it.

    Example::

        >>> err = CheckpointKindError("/ckpt/trainer_0.1", "it was not written by save_tree")
        >>> err.checkpoint, isinstance(err, ValueError)
        ('/ckpt/trainer_0.1', True)
    """

    def __init__(self, checkpoint: str, detail: str) -> None:
        self.checkpoint = checkpoint
        """The checkpoint read: its URL, or its name (``torch.5``)."""
        super().__init__(f"{checkpoint}: {detail}")


class CorruptCheckpointError(CkptStoreError, ValueError):
    """Stored bytes do not match the checksum or layout recorded when they were written.

    Example::

        >>> err = CorruptCheckpointError("CRC-32C mismatch", url="/ckpt", blob="w", chunk=3)
        >>> err.blob, err.chunk, err.file
        ('w', 3, None)

    Messages never quote a checksum value (that would help forge a matching chunk).
    """

    def __init__(
        self,
        detail: str,
        *,
        url: str,
        file: str | None = None,
        blob: str | None = None,
        chunk: int | None = None,
        node: str | None = None,
        epoch: int | None = None,
    ) -> None:
        self.detail = detail
        self.url = url
        self.file = file
        self.blob = blob
        self.chunk = chunk
        self.node = node
        self.epoch = epoch
        where = [f"in {url}"]
        if epoch is not None:
            where.append(f"epoch {epoch}")
        if node is not None:
            where.append(f"node {node!r}")
        if blob is not None:
            where.append(f"blob {blob!r}")
        if chunk is not None:
            where.append(f"chunk {chunk}")
        if file is not None:
            where.append(f"file {file!r}")
        super().__init__(
            f"corrupt checkpoint ({', '.join(where)}): {detail}. The data on storage changed "
            "after it was written; restore from another epoch or tier (`ckptstore verify` "
            "lists every damaged blob)."
        )

    def located(self, *, node: str, epoch: int) -> CorruptCheckpointError:
        """This error with the node checkpoint it was found in filled in (if unset)."""
        if self.node is not None and self.epoch is not None:
            return self
        return CorruptCheckpointError(
            self.detail,
            url=self.url,
            file=self.file,
            blob=self.blob,
            chunk=self.chunk,
            node=self.node if self.node is not None else node,
            epoch=self.epoch if self.epoch is not None else epoch,
        )

    def __reduce__(self) -> tuple[Any, ...]:
        fields = ("url", "file", "blob", "chunk", "node", "epoch")
        return (_rebuild_corrupt, (self.detail, {name: getattr(self, name) for name in fields}))


def _rebuild_corrupt(detail: str, fields: dict[str, Any]) -> CorruptCheckpointError:
    return CorruptCheckpointError(detail, **fields)


class CatalogCorruptError(CkptStoreError, ValueError):
    """A metadata handler's catalog (an index of the commit records) cannot be read.

    Jobs rebuild the catalog from storage by themselves when they meet this; it reaches
    the caller only from a catalog's own query methods.

    Example::

        >>> err = CatalogCorruptError("not valid JSON", url="/ckpt", file="catalog.json")
        >>> err.url, err.file, isinstance(err, ValueError)
        ('/ckpt', 'catalog.json', True)
        >>> str(err).endswith("`ckptstore catalog rebuild /ckpt` recreates it from storage")
        True

    ``rebuild``: the arguments of ``ckptstore catalog rebuild`` that recreate this
    catalog, when the root's URL alone does not name it (an sqlite file kept
    elsewhere: the root, then ``--kind sqlite --database FILE``).
    """

    def __init__(
        self,
        detail: str,
        *,
        url: str,
        file: str | None = None,
        rebuild: Sequence[str] = (),
    ) -> None:
        self.url = url
        self.file = file
        where = f"{file!r} of {url}" if file is not None else url
        command = shlex.join(["ckptstore", "catalog", "rebuild", *(rebuild or [url])])
        super().__init__(
            f"the catalog {where} is unreadable: {detail}. It is only an index of the "
            f"commit records: `{command}` recreates it from storage"
        )


class AlreadyCommittedError(CkptStoreError, FileExistsError):
    """A save would overwrite (or mix into) a node checkpoint that is already committed.

    Committed epochs are write-once; pass ``overwrite=True`` (managers, ``JobRunner``) or
    ``--fresh`` (``ckptstore demo``) to uncommit and replace them on purpose.

    Example::

        >>> from ckptstore import CheckpointManager, LocalSession
        >>> session = LocalSession()
        >>> session.workspace("trainer_0")["w"] = np.ones(2)
        >>> manager = CheckpointManager("write_once", "trainer_0", "npz")
        >>> _ = session.run(manager.init(["trainer_0"]))
        >>> _ = session.run(manager.save(1))
        >>> try:
        ...     _ = session.run(manager.save(1))
        ... except AlreadyCommittedError as err:
        ...     print(err.epoch, err.nodes)
        1 ('trainer_0',)
    """

    def __init__(
        self, url: str, epoch: int, nodes: Iterable[str], *, hint: str | None = None
    ) -> None:
        self.url = url
        self.epoch = epoch
        self.nodes = tuple(sorted(nodes))
        what_to_do = hint or (
            "Resume from it, save a new epoch, or pass overwrite=True (CLI: --fresh) to "
            "replace it on purpose"
        )
        CkptStoreError.__init__(
            self,
            f"epoch {epoch} is already committed for node(s) {list(self.nodes)} under {url}; "
            f"committed checkpoints are write-once, so nothing was written. {what_to_do}.",
        )


class TooManySaveFailuresError(CkptStoreError, RuntimeError):
    """The job stopped because ``max_consecutive_save_failures`` saves in a row failed.

    Example::

        >>> err = TooManySaveFailuresError(2, OSError("disk full"))
        >>> err.failures, isinstance(err, RuntimeError)
        (2, True)
    """

    def __init__(self, failures: int, last_error: BaseException) -> None:
        self.failures = failures
        self.last_error = last_error
        super().__init__(
            f"{failures} consecutive checkpoint saves failed (last: {last_error}); the job "
            "stopped so that it does not run on without a usable checkpoint. Fix the storage "
            "problem and re-run: the job resumes from the last committed epoch."
        )
