"""Exceptions packed on a worker come back with their class, attributes and notes."""

from __future__ import annotations

import pickle
import threading

from ckptstore.dask_session._shipping import ShippedError
from ckptstore.errors import (
    NodeLostError,
    SaveFailedError,
    StorageError,
    TooManySaveFailuresError,
)


def travel(error: BaseException, note: str | None = None) -> BaseException:
    return pickle.loads(pickle.dumps(ShippedError.pack(error, note))).unpack()


def raised(error: BaseException) -> BaseException:
    try:
        raise error
    except BaseException as caught:
        return caught


def test_a_picklable_exception_travels_as_itself() -> None:
    error = travel(raised(KeyError("w")), note="ran on worker tcp://a:1")
    assert isinstance(error, KeyError)
    assert error.args == ("w",)
    assert error.__notes__[0] == "ran on worker tcp://a:1"
    assert error.__notes__[1].startswith("remote traceback")
    assert "test_shipping.py" in error.__notes__[1]


def test_errors_whose_init_takes_other_arguments_keep_class_and_attributes() -> None:
    original = SaveFailedError(4, "s3://b/run", {"trainer_1": "timeout"})
    error = travel(original)
    assert type(error) is SaveFailedError
    assert str(error) == str(original)
    assert error.node_errors == {"trainer_1": "timeout"}
    assert error.failed_nodes == ("trainer_1",)
    assert isinstance(error, OSError)  # still caught by the runner's retry logic


def test_nested_errors_travel_too() -> None:
    cause = StorageError("/ckpt", "trainer_0.1/a", "write", PermissionError("denied"))
    error = travel(TooManySaveFailuresError(3, cause))
    assert isinstance(error, TooManySaveFailuresError)
    assert type(error.last_error) is StorageError
    assert error.last_error.key == "trainer_0.1/a"


def test_unpicklable_attributes_become_their_repr() -> None:
    error = RuntimeError("held a lock")
    error.lock = threading.Lock()  # type: ignore[attr-defined]
    shipped = travel(error)
    assert type(shipped) is RuntimeError
    assert str(shipped) == "held a lock"
    assert "lock" in shipped.lock  # type: ignore[attr-defined]


def test_node_lost_errors_pickle_with_their_notes() -> None:
    error = NodeLostError("trainer_2", "tcp://a:1", "its worker left")
    error.add_note("raised by task 'save'")
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.node, copy.worker, str(copy)) == (error.node, error.worker, str(error))
    assert copy.__notes__ == ["raised by task 'save'"]
