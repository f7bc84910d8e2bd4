"""Exceptions packed to travel from a worker back to the client.

Many exceptions do not survive pickling: a class whose ``__init__`` takes other
arguments than its message (most ckptstore errors) cannot be rebuilt from ``args``.
:class:`ShippedError` carries either the exception's own pickle (when it round-trips)
or its class, ``args`` and attributes, and rebuilds an exception of the same class on
the client, so ``except SaveFailedError`` or ``except OSError`` keep working there.

Example::

    >>> from ckptstore.errors import StorageError
    >>> shipped = ShippedError.pack(StorageError("/ckpt", "a", "write", PermissionError()))
    >>> error = pickle.loads(pickle.dumps(shipped)).unpack()
    >>> type(error).__name__, error.url  # a StorageError again
    ('StorageError', '/ckpt')
"""

from __future__ import annotations

import pickle
import traceback
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ShippedError"]


@dataclass(frozen=True)
class ShippedError:
    """An exception packed for the trip to another process.

    Example::

        >>> error = ShippedError.pack(ValueError("bad"), note="raised on worker tcp://10.0.0.5:4000").unpack()
        >>> error.__notes__
        ['raised on worker tcp://10.0.0.5:4000']
    """

    pickled: bytes | None = None
    error_type: type[BaseException] | None = None
    args: tuple[Any, ...] = ()
    state: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def pack(cls, error: BaseException, note: str | None = None) -> ShippedError:
        """Pack ``error`` (adding ``note`` and its traceback as notes, since tracebacks
        do not travel)."""
        if note is not None:
            error.add_note(note)
        frames = traceback.format_tb(error.__traceback__)
        if frames:
            error.add_note("remote traceback (most recent call last):\n" + "".join(frames))
        try:
            data = pickle.dumps(error)
            rebuilt = pickle.loads(data)
        except Exception:
            rebuilt = None
        if type(rebuilt) is type(error) and str(rebuilt) == str(error):
            return cls(pickled=data)
        return cls(
            error_type=type(error),
            args=tuple(_portable(value) for value in error.args),
            state={name: _portable(value) for name, value in vars(error).items()},
        )

    def unpack(self) -> BaseException:
        """The exception, rebuilt in this process."""
        if self.pickled is not None:
            error: BaseException = pickle.loads(self.pickled)
            return error
        assert self.error_type is not None
        args = tuple(_restore(value) for value in self.args)
        error = self.error_type.__new__(self.error_type, *args)
        error.args = args
        for name, value in self.state.items():
            setattr(error, name, _restore(value))
        return error


def _portable(value: Any) -> Any:
    """``value`` if it pickles, a packed exception for an exception, else its repr."""
    if isinstance(value, BaseException):
        return ShippedError.pack(value)
    try:
        pickle.loads(pickle.dumps(value))
    except Exception:
        return repr(value)
    return value


def _restore(value: Any) -> Any:
    return value.unpack() if isinstance(value, ShippedError) else value
