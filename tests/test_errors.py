"""Errors: one root, the built-in a caller would already catch, and messages that say
what to do next."""

from __future__ import annotations

import pickle

import pytest

from ckptstore import (
    CheckpointNotFoundError,
    CkptStoreError,
    CorruptCheckpointError,
    JobConfigurationError,
    SaveFailedError,
    StorageError,
)
from ckptstore.errors import (
    AlreadyCommittedError,
    BlobNotFoundError,
    CheckpointKindError,
    DocumentChangedError,
    DuplicatePluginError,
    FrozenGroupError,
    InvalidEpochError,
    InvalidNameError,
    InvalidPluginError,
    KeyExistsError,
    LeaseHeldError,
    LeaseLostError,
    MissingObjectError,
    NodeLostError,
    NotRunError,
    ObjectNotFoundError,
    PluginError,
    RangeNotSatisfiableError,
    RequestError,
    RestoreMismatchError,
    TierConflictError,
    TooManySaveFailuresError,
    UnknownPluginError,
    UnsupportedBlobError,
    is_permanent,
)

ERRORS: list[tuple[CkptStoreError, type[BaseException]]] = [
    (UnknownPluginError("db type", "x", ["npz"], None), KeyError),
    (DuplicatePluginError("db type", "x", ["a", "b"]), ValueError),
    (InvalidPluginError("bad"), TypeError),
    (InvalidNameError("blob name", "../x", "no"), ValueError),
    (JobConfigurationError("bad"), ValueError),
    (InvalidEpochError("epoch", "1", "it is a str"), ValueError),
    (CheckpointKindError("/c/trainer_0.1", "not a tree"), ValueError),
    (RestoreMismatchError("model/weight", "shape (2,)", "shape (3,)"), ValueError),
    (FrozenGroupError("bad"), RuntimeError),
    (NotRunError("bad"), RuntimeError),
    (UnsupportedBlobError("w", "objects"), TypeError),
    (BlobNotFoundError(["w"], "here", "fix it"), KeyError),
    (CheckpointNotFoundError("/c", "n", 1, "gone"), FileNotFoundError),
    (CorruptCheckpointError("bad", url="/c"), ValueError),
    (StorageError("/c", "k", "write", OSError("x")), OSError),
    (ObjectNotFoundError("/c", "k", "read", OSError("x")), FileNotFoundError),
    (SaveFailedError(1, "/c", {"n": "x"}), OSError),
    (TooManySaveFailuresError(3, OSError("x")), RuntimeError),
    (NodeLostError("n", "tcp://w", "worker died"), RuntimeError),
    (KeyExistsError("/c", "_ckptstore/x"), FileExistsError),
    (AlreadyCommittedError("/c", 3, ["n"]), FileExistsError),
    (TierConflictError("s3://b/run", 3, ["n"]), FileExistsError),
    (LeaseHeldError("/c", "n", "host h, pid 1", 30.0), RuntimeError),
    (DocumentChangedError("/c", "_ckptstore/lease/n.json"), FileExistsError),
    (LeaseLostError("/c", "n", 3, "an operator broke it"), RuntimeError),
    (RequestError("GET s3://b/k: HTTP 503", status=503, attempts=8, retryable=True), OSError),
    (MissingObjectError("GET s3://b/k: 404", status=404, attempts=1, retryable=False), OSError),
]


@pytest.mark.parametrize(("error", "builtin"), ERRORS, ids=lambda e: type(e).__name__)
def test_every_error_is_a_ckptstore_error_and_the_expected_builtin(
    error: CkptStoreError, builtin: type[BaseException]
) -> None:
    assert isinstance(error, CkptStoreError)
    assert isinstance(error, builtin)
    assert str(error)
    assert not str(error).startswith(("'", '"'))  # KeyError subclasses print plainly


def test_storage_failures_are_one_oserror_family() -> None:
    """Failed requests and failed saves are StorageErrors too: one ``except`` for all,
    each with the location involved; the old names keep working."""
    for cls in (RequestError, MissingObjectError, RangeNotSatisfiableError, SaveFailedError):
        assert issubclass(cls, StorageError)
    request = RequestError("PUT s3://b/k: HTTP 403", status=403, attempts=1, retryable=False)
    assert (request.url, request.key, request.action) == ("", None, "request")
    assert str(request) == "PUT s3://b/k: HTTP 403"
    failed = SaveFailedError(2, "/c", {"n": "x"})
    assert (failed.url, failed.key, failed.action) == ("/c", None, "save")
    # an object store's "access denied" is permanent as is, and wrapped in a StorageError
    assert is_permanent(request)
    wrapped = StorageError("s3://b", "k", "write", request)
    wrapped.__cause__ = request  # as `raise ... from request` sets it
    assert is_permanent(wrapped)
    transient = RequestError("PUT s3://b/k: HTTP 503", status=503, attempts=8, retryable=True)
    assert not is_permanent(transient)


def test_plugin_errors_share_a_base() -> None:
    for cls in (UnknownPluginError, DuplicatePluginError, InvalidPluginError):
        assert issubclass(cls, PluginError)


def test_messages_carry_their_context() -> None:
    corrupt = CorruptCheckpointError("crc", url="/c", file="f", blob="w", chunk=2)
    assert "in /c, blob 'w', chunk 2, file 'f'" in str(corrupt)
    assert (corrupt.url, corrupt.file, corrupt.blob, corrupt.chunk) == ("/c", "f", "w", 2)
    storage = StorageError("s3://b/run/", "k/1", "write", OSError("denied"))
    assert "could not write s3://b/run/k/1: OSError: denied" in str(storage)
    assert StorageError("/c", None, "sync", OSError("x")).key is None
    failed = SaveFailedError(4, "/c", {"a": "disk full", "b": "gone"})
    assert failed.failed_nodes == ("a", "b")
    assert "node 'a': disk full; node 'b': gone" in str(failed)
    missing = BlobNotFoundError(["x", "y"], "the workspace", "create it")
    assert str(missing) == "blob(s) 'x', 'y' not found in the workspace; create it."
    unknown = UnknownPluginError("db type", "lmdb", ["zarr", "npz"], "pip install it")
    assert (
        str(unknown)
        == "unknown db type 'lmdb'; installed: npz, zarr. To use 'lmdb', pip install it."
    )
    assert UnknownPluginError("db type", "x", [], None).installed == ()
    too_many = TooManySaveFailuresError(2, OSError("x"))
    assert "2 consecutive checkpoint saves failed" in str(too_many)
    assert str(CkptStoreError()) == "CkptStoreError"


def test_node_lost_errors_survive_pickling() -> None:
    error = NodeLostError("trainer_0", "tcp://10.0.0.1:1234", "worker died")
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.node, copy.worker, copy.detail) == (error.node, error.worker, error.detail)
    assert str(copy) == str(error)
