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

import errno as _errno
import shlex
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ckptstore._suggest import closest

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


class CkptStoreError(Exception):
    """Root of every ckptstore error.

    Example::

        >>> from ckptstore.records import validate_blob_name
        >>> try:
        ...     validate_blob_name("../escape")
        ... except CkptStoreError as err:
        ...     print("checkpointing failed:", type(err).__name__)
        checkpointing failed: InvalidNameError
    """

    def __str__(self) -> str:
        # KeyError quotes its argument; every ckptstore error prints its message as is.
        return str(self.args[0]) if self.args else self.__class__.__name__


# --- configuration and plugins -------------------------------------------------------


class PluginError(CkptStoreError):
    """A plugin could not be found, loaded or registered.

    Example::

        >>> from ckptstore.plugin import get_registry
        >>> try:
        ...     get_registry().db_type("nosuchformat")
        ... except PluginError as err:
        ...     print(type(err).__name__)
        UnknownPluginError
    """


class UnknownPluginError(PluginError, KeyError):
    """No installed plugin provides the requested name; ``suggestion`` is the installed
    name closest to it, if one is alike (a typo), and the message asks "did you mean".

    Example::

        >>> from ckptstore.plugin import get_registry
        >>> get_registry().db_type("nosuchformat")
        Traceback (most recent call last):
        ckptstore.errors.UnknownPluginError: ...
        >>> try:
        ...     get_registry().db_type("nzp")
        ... except UnknownPluginError as error:
        ...     print(error.suggestion, "|", error)
        npz | unknown db type 'nzp' (did you mean 'npz'?); installed: ...
    """

    def __init__(self, kind: str, name: str, installed: Iterable[str], hint: str | None) -> None:
        self.kind = kind
        self.name = name
        self.installed = tuple(sorted(installed))
        listing = ", ".join(self.installed) or "none"
        close = closest(name, self.installed)
        self.suggestion = close
        guess = f" (did you mean {close!r}?)" if close else ""
        fix = hint or "install a plugin that provides it (see `ckptstore plugins`)"
        super().__init__(
            f"unknown {kind} {name!r}{guess}; installed: {listing}. To use {name!r}, {fix}."
        )


class BrokenPluginError(UnknownPluginError):
    """The requested name is, or may be, provided by an installed plugin that was left out
    because it failed to import, validate or answer a hook (``ckptstore plugins`` lists
    it with its error).

    ``broken`` lists each such plugin as ``(entry-point name, distribution, error)``;
    ``declared`` says whether they declared ``name`` (``False``: they failed before
    saying what they provide, so the name may be theirs or nobody's).

    Example::

        >>> broken = [("fast", "ckptstore-fast 0.1", "ImportError: no numba")]
        >>> err = BrokenPluginError("db type", "fast", ["npz"], broken, declared=True)
        >>> print(err)
        db type 'fast' comes from a broken plugin that was left out: plugin 'fast' (ckptstore-fast 0.1): ImportError: no numba. To use 'fast', fix or reinstall it; to stop loading it, set CKPTSTORE_DISABLE_PLUGINS=fast. Installed: npz.
        >>> isinstance(err, UnknownPluginError), isinstance(err, KeyError)
        (True, True)
    """  # noqa: E501

    def __init__(
        self,
        kind: str,
        name: str,
        installed: Iterable[str],
        broken: Iterable[tuple[str, str, str]],
        *,
        declared: bool,
        hint: str | None = None,
    ) -> None:
        super().__init__(kind, name, installed, hint)
        self.broken = tuple(broken)
        self.declared = declared
        self.hint = hint
        one = len(self.broken) == 1
        source = "a broken plugin that was" if one else "broken plugins that were"
        it = "it" if one else "them"
        which = "; ".join(
            f"plugin {plugin!r} ({distribution}): {error}"
            for plugin, distribution, error in self.broken
        )
        block = "CKPTSTORE_DISABLE_PLUGINS=" + ",".join(plugin for plugin, _, _ in self.broken)
        listing = ", ".join(self.installed) or "none"
        if declared:
            message = (
                f"{kind} {name!r} comes from {source} left out: {which}. To use {name!r}, "
                f"fix or reinstall {it}; to stop loading {it}, set {block}. "
                f"Installed: {listing}."
            )
        else:
            fix = hint or "install a plugin that provides it (see `ckptstore plugins`)"
            message = (
                f"unknown {kind} {name!r}; installed: {listing}. It may come from {source} "
                f"left out: {which}. Fix or reinstall {it}, or set {block} to stop loading "
                f"{it}; otherwise, to use {name!r}, {fix}."
            )
        self.args = (message,)

    def __reduce__(self) -> tuple[Any, ...]:
        arguments = (self.kind, self.name, self.installed, self.broken)
        return (_rebuild_broken_plugin, (arguments, self.declared, self.hint))


def _rebuild_broken_plugin(
    arguments: tuple[str, str, tuple[str, ...], tuple[tuple[str, str, str], ...]],
    declared: bool,
    hint: str | None,
) -> BrokenPluginError:
    return BrokenPluginError(*arguments, declared=declared, hint=hint)


class DuplicatePluginError(PluginError, ValueError):
    """Two plugins claim the same name for one extension point.

    Example::

        >>> err = DuplicatePluginError("db type", "zarr", ["ckptstore", "my-plugin"])
        >>> err.providers, isinstance(err, ValueError)
        (('ckptstore', 'my-plugin'), True)
    """

    def __init__(self, kind: str, name: str, providers: Iterable[str]) -> None:
        self.kind = kind
        self.name = name
        self.providers = tuple(providers)
        super().__init__(
            f"{kind} {name!r} is provided by more than one plugin ({', '.join(self.providers)}); "
            "uninstall one of them or block it with CKPTSTORE_DISABLE_PLUGINS."
        )


class InvalidPluginError(PluginError, TypeError):
    """A plugin returned something that does not honour its extension point's contract.

    Example::

        >>> from ckptstore import CheckpointManager
        >>> CheckpointManager("ckpt", "trainer_0", db_type=42)
        Traceback (most recent call last):
        ckptstore.errors.InvalidPluginError: expected a db type name or a DBType instance, got int
    """


class InvalidNameError(CkptStoreError, ValueError):
    """A node, blob or storage key name could escape the checkpoint prefix or is malformed.

    Example::

        >>> from ckptstore.records import validate_blob_name
        >>> validate_blob_name("../etc/passwd")
        Traceback (most recent call last):
        ckptstore.errors.InvalidNameError: ...
    """

    def __init__(self, what: str, name: object, reason: str) -> None:
        self.what = what
        self.name = name
        super().__init__(f"invalid {what} {name!r}: {reason}.")


class InvalidEpochError(CkptStoreError, ValueError):
    """An epoch argument is not an epoch: epochs are non-negative integers below 2**63
    (``int`` or a numpy integer); bools, floats, strings and negative numbers are refused
    where they enter, before anything is written or read. Always a ``ValueError``, also
    for a value of the wrong type.

    Example::

        >>> from ckptstore.records import validate_epoch
        >>> validate_epoch(np.int64(3)), validate_epoch(7, "resume_from_epoch")
        (3, 7)
        >>> validate_epoch("3", "resume_from_epoch")
        Traceback (most recent call last):
        ckptstore.errors.InvalidEpochError: resume_from_epoch='3' is not an epoch: ...
    """

    def __init__(self, argument: str, value: object, reason: str) -> None:
        self.argument = argument
        self.value = value
        super().__init__(
            f"{argument}={value!r} is not an epoch: {reason}; pass a non-negative integer "
            f"(an int or numpy integer below 2**63), e.g. {argument}=3"
        )


class JobConfigurationError(CkptStoreError, ValueError):
    """A job, runner or manager was set up in a way that cannot work.

    Its I/O settings (:class:`~ckptstore.IOSettings`) are part of that setup.

    Example::

        >>> from ckptstore import Job, JobRunner, LocalSession
        >>> JobRunner(Job(), resume_from_epoch=3).train(LocalSession())  # no manager to resume from
        Traceback (most recent call last):
        ckptstore.errors.JobConfigurationError: ...
    """


class EnvironmentVariableError(CkptStoreError, ValueError):
    """A ``CKPTSTORE_*`` environment variable holds a value that cannot be used.

    Example::

        >>> from ckptstore import IOSettings
        >>> import os
        >>> os.environ["CKPTSTORE_IO_CONCURRENCY"] = "four"
        >>> try:
        ...     IOSettings().with_environment()
        ... except EnvironmentVariableError as err:
        ...     print(err.variable, repr(err.value))
        ... finally:
        ...     del os.environ["CKPTSTORE_IO_CONCURRENCY"]
        CKPTSTORE_IO_CONCURRENCY 'four'
    """

    def __init__(self, variable: str, value: str, expected: str) -> None:
        self.variable = variable
        self.value = value
        super().__init__(
            f"environment variable {variable}={value!r} is not valid: expected {expected}; "
            f"set it to such a value or unset it (unset {variable})"
        )


class StorageOptionError(CkptStoreError, TypeError):
    """A storage option (``storage_options=`` or the CLI's ``-o KEY=VALUE``) is not one
    the URL's path type takes, or its value is wrong.

    Example::

        >>> err = StorageOptionError(  # what ``ckptstore ... -o durabilty=fsync`` reports
        ...     "ckpt", "local", "-o durabilty='fsync' refused", "did you mean -o durability=...?"
        ... )
        >>> err.path_type, isinstance(err, TypeError)
        ('local', True)
    """

    def __init__(self, url: str, path_type: str, detail: str, fix: str) -> None:
        self.url = url
        self.path_type = path_type
        super().__init__(f"storage option for {url} (path type {path_type!r}): {detail}; {fix}")


class FrozenGroupError(CkptStoreError, RuntimeError):
    """A task was added to a group that has already been compiled or run.

    Example::

        >>> from ckptstore import LocalSession, Task, TaskGroup
        >>> group = TaskGroup()
        >>> with group:
        ...     _ = Task(lambda ws: None)
        >>> _ = LocalSession().run(group)
        >>> with group:
        ...     _ = Task(lambda ws: None)
        Traceback (most recent call last):
        ckptstore.errors.FrozenGroupError: ...
    """


class NotRunError(CkptStoreError, RuntimeError):
    """A task output was fetched before any session ran the task.

    Example::

        >>> from ckptstore import Task
        >>> Task(lambda ws: None, outputs=["x"]).outputs()[0].fetch()
        Traceback (most recent call last):
        ckptstore.errors.NotRunError: ...
    """


# --- blobs ----------------------------------------------------------------------------


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


# --- checkpoints ----------------------------------------------------------------------


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


class StorageError(CkptStoreError, OSError):
    """A read or write on a path type failed after its retries.

    It is the root of ckptstore's one family of ``OSError`` subclasses: storage
    failures, failed object-store requests, failed saves. Each carries the ``url``,
    ``key`` and ``action`` involved.

    Example::

        >>> err = StorageError("/ckpt", "trainer_0.1/w", "write", OSError(28, "No space left"))
        >>> err.url, err.key, isinstance(err, OSError)
        ('/ckpt', 'trainer_0.1/w', True)
    """

    def __init__(self, url: str, key: str | None, action: str, cause: BaseException) -> None:
        self.url = url
        self.key = key
        self.action = action
        target = f"{url.rstrip('/')}/{key}" if key else url
        code = cause.errno if isinstance(cause, OSError) else None
        name = (
            f" ({_errno.errorcode[code]})" if code is not None and code in _errno.errorcode else ""
        )
        super().__init__(
            f"could not {action} {target}: {type(cause).__name__}{name}: {cause}. {self.fix}"
        )
        self.errno = code  # the cause's errno, so callers and is_permanent() can branch on it

    fix = "Check that the location exists, is reachable and that your credentials allow it."


class ObjectNotFoundError(StorageError, FileNotFoundError):
    """A key that should exist under a path type's root does not.

    Example::

        >>> from ckptstore.builtin import LocalPath
        >>> try:
        ...     LocalPath("ckpt").read_bytes("missing")
        ... except FileNotFoundError as err:
        ...     print(type(err).__name__)
        ObjectNotFoundError
    """


class KeyExistsError(StorageError, FileExistsError):
    """A create-only write (:meth:`PathType.create_document`) found the key already
    there: another writer created it first. Nothing was written.

    Example::

        >>> from ckptstore.builtin import LocalPath
        >>> storage = LocalPath("documents")
        >>> storage.create_document("claim", b"first")
        >>> try:
        ...     storage.create_document("claim", b"second")
        ... except KeyExistsError as err:  # also a FileExistsError
        ...     print(err.key, storage.read_bytes("claim"))
        claim b'first'
    """

    def __init__(self, url: str, key: str) -> None:
        self.url = url
        self.key = key
        self.action = "create"
        target = f"{url.rstrip('/')}/{key}"
        CkptStoreError.__init__(
            self,
            f"{target} already exists; it was created by another writer and was left as it "
            "is. Read it to see what it holds, or delete it first if it is stale.",
        )


class DocumentChangedError(StorageError, FileExistsError):
    """A conditional replace (:meth:`PathType.replace_document`) found the document
    changed (or created, or deleted) since it was read: another writer got there first.
    Nothing was written.

    Example::

        >>> from ckptstore.builtin import LocalPath
        >>> storage = LocalPath("documents")
        >>> storage.create_document("state", b"one")
        >>> _, version = storage.get_versioned_document("state")
        >>> storage.replace_document("state", b"two", version)
        >>> try:
        ...     storage.replace_document("state", b"three", version)  # a stale version
        ... except DocumentChangedError as err:  # also a FileExistsError
        ...     print(err.key, storage.read_bytes("state"))
        state b'two'
    """

    def __init__(self, url: str, key: str) -> None:
        self.url = url
        self.key = key
        self.action = "replace"
        target = f"{url.rstrip('/')}/{key}"
        CkptStoreError.__init__(
            self,
            f"{target} changed since it was read: another writer replaced it first, and "
            "nothing was written. Read it again and decide from what it holds now.",
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


class StorageFullError(StorageError):
    """The storage is full (ENOSPC, EDQUOT): nothing was committed and no temporary
    file was left; the last committed epoch still loads.

    Example::

        >>> err = storage_error("/ckpt", "trainer_0.1/w", "write", OSError(28, "No space left"))
        >>> type(err).__name__, err.errno, isinstance(err, OSError)
        ('StorageFullError', 28, True)
    """

    fix = (
        "The disk (or quota) is full: free space or point the job at a larger volume, "
        "then re-run; the job resumes from the last committed epoch."
    )


class StorageIOError(StorageError):
    """The device reported an I/O error (EIO): the write may be torn, so the epoch was
    not committed; the last committed epoch still loads.

    Example::

        >>> err = storage_error("/ckpt", "trainer_0.1/w", "write", OSError(5, "I/O error"))
        >>> type(err).__name__, err.url, err.key
        ('StorageIOError', '/ckpt', 'trainer_0.1/w')
    """

    fix = (
        "The device reported an I/O error: check the disk (dmesg, SMART) and re-run; the "
        "job resumes from the last committed epoch."
    )


class StorageNotWritableError(StorageError, PermissionError):
    """The location cannot be written (or, for a read or a listing, read) and retrying
    cannot change that: permission denied (EACCES, EPERM), a read-only filesystem
    (EROFS), a name the filesystem refuses (ENAMETOOLONG) or a checkpoint directory
    that cannot be created.

    Example::

        >>> err = storage_error("/ckpt", None, "create", PermissionError(13, "denied"))
        >>> type(err).__name__, err.errno, isinstance(err, PermissionError)
        ('StorageNotWritableError', 13, True)
    """

    fix = (
        "Retrying cannot fix this: give this user access to the location (or choose one "
        "it can read and write), remount it read-write, or shorten the node and blob names."
    )


_NOT_WRITABLE = frozenset({_errno.EACCES, _errno.EPERM, _errno.EROFS, _errno.ENAMETOOLONG})
_FULL = frozenset({_errno.ENOSPC, _errno.EDQUOT})
CREDENTIAL_STATUSES = frozenset({401, 403})  # an object store's "access denied": never retried


def storage_error(url: str, key: str | None, action: str, cause: BaseException) -> StorageError:
    """The :class:`StorageError` subclass for ``cause``, chosen by its errno: full
    (ENOSPC, EDQUOT), I/O (EIO), not writable (EACCES, EPERM, EROFS, ENAMETOOLONG).

    Example::

        >>> type(storage_error("/ckpt", "k", "write", OSError(30, "read-only"))).__name__
        'StorageNotWritableError'
        >>> type(storage_error("/ckpt", "k", "write", TimeoutError("slow"))).__name__
        'StorageError'
    """
    code = cause.errno if isinstance(cause, OSError) else None
    if code in _FULL:
        return StorageFullError(url, key, action, cause)
    if code == _errno.EIO:
        return StorageIOError(url, key, action, cause)
    if code in _NOT_WRITABLE:
        return StorageNotWritableError(url, key, action, cause)
    return StorageError(url, key, action, cause)


def is_permanent(error: BaseException) -> bool:
    """True for an error that retrying the save cannot fix (permission denied, a
    read-only filesystem, a name too long), which must stop the job at once.

    Example::

        >>> is_permanent(PermissionError(13, "denied")), is_permanent(TimeoutError("slow"))
        (True, False)
    """
    if isinstance(error, StorageNotWritableError | InvalidNameError | UnsupportedBlobError):
        return True
    # an object store's "access denied" (HTTP 401/403), as is or wrapped in StorageError
    wrapped = isinstance(error, StorageError) and not isinstance(error, RequestError)
    cause = error.__cause__ if wrapped else error
    if isinstance(cause, RequestError) and cause.status in CREDENTIAL_STATUSES:
        return True
    return isinstance(error, OSError) and error.errno in _NOT_WRITABLE


def is_disk_full(error: BaseException) -> bool:
    """True for ENOSPC/EDQUOT: a failed save that counts, but is not retried at once.

    Example::

        >>> is_disk_full(OSError(28, "No space left on device")), is_disk_full(OSError(5, "EIO"))
        (True, False)
    """
    return isinstance(error, StorageFullError) or (
        isinstance(error, OSError) and error.errno in _FULL
    )


class SaveFailedError(StorageError):
    """A checkpoint save failed on one or more nodes; the epoch was not committed.

    ``node_errors`` maps each failed node to what went wrong there.

    Example::

        >>> err = SaveFailedError(3, "/ckpt", {"trainer_1": "disk full"})
        >>> err.epoch, err.failed_nodes
        (3, ('trainer_1',))
    """

    def __init__(self, epoch: int, url: str, node_errors: Mapping[str, str]) -> None:
        self.epoch = epoch
        self.url = url
        self.key = None
        self.action = "save"
        self.node_errors = dict(node_errors)
        causes = "; ".join(f"node {node!r}: {error}" for node, error in self.node_errors.items())
        CkptStoreError.__init__(
            self,
            f"epoch {epoch} was not committed under {url}: the save failed on "
            f"{len(self.node_errors)} node(s) ({causes}). Check that every node can write "
            "there; the job resumes from the last committed epoch.",
        )

    @property
    def failed_nodes(self) -> tuple[str, ...]:
        return tuple(self.node_errors)


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


# --- distributed sessions -------------------------------------------------------------


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


class RequestError(StorageError):
    """An object-store request that failed for good, described without credentials.

    ``status`` is the HTTP status (``None`` if no answer came), ``code`` the store's
    error code, ``attempts`` how many requests were made, ``retryable`` whether the last
    failure was a transient one (the retries ran out). ``url`` and ``key`` are empty:
    the message names the request; a path type wraps it in a :class:`StorageError`
    naming both.

    Example::

        >>> err = RequestError("PUT s3://b/k: HTTP 503 SlowDown", status=503, code="SlowDown",
        ...                    attempts=8, retryable=True)
        >>> err.status, err.attempts, err.retryable
        (503, 8, True)
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None,
        code: str | None = None,
        attempts: int,
        retryable: bool,
    ) -> None:
        CkptStoreError.__init__(self, message)
        self.url = ""
        self.key = None
        self.action = "request"
        self.status = status
        self.code = code
        self.attempts = attempts
        self.retryable = retryable

    def __str__(self) -> str:
        return str(self.args[0])


class MissingObjectError(RequestError, FileNotFoundError):
    """The object (not the bucket) does not exist.

    Example::

        >>> err = MissingObjectError("GET s3://b/k: 404", status=404, attempts=1, retryable=False)
        >>> isinstance(err, FileNotFoundError)
        True
    """


class RangeNotSatisfiableError(RequestError):
    """A ranged read started at or past the end of the object.

    Example::

        >>> err = RangeNotSatisfiableError("GET s3://b/k: 416", status=416, attempts=1,
        ...                                retryable=False)
        >>> isinstance(err, RequestError)
        True
    """


class InProcessMockError(CkptStoreError, TypeError):
    """moto's in-process ``mock_aws`` cannot serve this S3 request.

    ``mock_aws`` answers inside botocore with synchronous responses, which aiobotocore
    (under s3fs and ckptstore's S3 plugin) cannot await. While a mock is active, the S3
    plugin therefore sends the requests it would intercept (those bound for AWS) to
    moto's server, run in the test process, and plain ``with mock_aws():`` just works.
    This error remains for what that cannot cover: moto's server extra is not installed
    (``missing`` names it), or the mock intercepted a request the plugin did not expect
    it to (an endpoint it does not know as AWS's), where
    ``ckptstore.testing.in_process_moto()`` is the way out.

    Example::

        >>> err = InProcessMockError("PUT s3://bucket/run/trainer_0.1/w")
        >>> err.request, isinstance(err, TypeError), "in_process_moto()" in str(err)
        ('PUT s3://bucket/run/trainer_0.1/w', True, True)
        >>> "moto[server]" in str(InProcessMockError("s3://b", missing="flask"))
        True
    """

    def __init__(self, request: str, *, missing: str | None = None) -> None:
        self.request = request
        if missing is not None:
            super().__init__(
                f"{request}: moto's in-process mock_aws is active, and ckptstore serves its "
                "S3 requests through moto's server in this process, which needs moto's "
                f"server extra ({missing}): `pip install 'moto[server]'`. Nothing is wrong "
                "with the location or the credentials; see docs/testing.md."
            )
            return
        super().__init__(
            f"{request}: moto's in-process mock_aws intercepted this request, but it answers "
            "with botocore's synchronous responses, which aiobotocore (used by s3fs and the "
            "ckptstore S3 plugin) cannot await; nothing is wrong with the location or the "
            "credentials. ckptstore sends the requests mock_aws intercepts to moto's server "
            "in this process by itself, but did not expect this one to be intercepted: put "
            "`with ckptstore.testing.in_process_moto() as server:` inside your mock_aws "
            "block and pass `storage_options=server.storage_options` (it serves the same "
            "mocked buckets over HTTP on 127.0.0.1); see docs/testing.md."
        )
