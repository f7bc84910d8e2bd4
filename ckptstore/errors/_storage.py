"""The ``OSError`` family: storage failures, failed object-store requests and failed
saves, and how an ``OSError`` is judged (permanent, disk full)."""

from __future__ import annotations

import errno as _errno
from collections.abc import Mapping

from ckptstore.errors._base import CkptStoreError
from ckptstore.errors._checkpoint import UnsupportedBlobError
from ckptstore.errors._configuration import InvalidNameError


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
