"""Workspaces: a node's named numpy arrays ("blobs")."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, MutableMapping

import numpy as np

from ckptstore.errors import BlobNotFoundError
from ckptstore.records import check_value, validate_blob_name

__all__ = ["PrivateWorkspace", "Workspace", "as_blob"]


def as_blob(name: str, value: object) -> np.ndarray:
    """Convert ``value`` to a checkpointable array, refusing what cannot be stored exactly
    (see :mod:`ckptstore.records._dtypes`): object arrays (they would need pickle, and
    ckptstore never unpickles on load), structured and void dtypes, and masked arrays.
    """
    array = value if isinstance(value, np.ndarray) else np.asarray(value)
    check_value(name, array)
    return array


class Workspace(MutableMapping[str, np.ndarray]):
    """A node's blobs: a mapping from blob name to numpy array.

    Values are stored by reference, so a task may update an array in place. Assigning a
    Python scalar or list converts it with ``np.asarray``; object, structured and masked
    arrays are refused.

    Example::

        >>> ws = Workspace()
        >>> ws["total"] = np.array([100])
        >>> ws["total"] += 3
        >>> sorted(ws), ws["total"]
        (['total'], array([103]))
    """

    def __init__(self, blobs: Mapping[str, object] | None = None) -> None:
        self._blobs: dict[str, np.ndarray] = {}
        for name, value in (blobs or {}).items():
            self[name] = value

    def __getitem__(self, name: str) -> np.ndarray:
        try:
            return self._blobs[name]
        except KeyError:
            raise BlobNotFoundError(
                [name], "this workspace", "create it in the job's init_group or load it first"
            ) from None

    def __setitem__(self, name: str, value: object) -> None:
        # new=False: loads put names from older checkpoints here; new names are held to
        # the segment limit when init lists them and when a save starts
        self._blobs[validate_blob_name(name, new=False)] = as_blob(name, value)

    def __delitem__(self, name: str) -> None:
        del self._blobs[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._blobs)

    def __len__(self) -> int:
        return len(self._blobs)

    def __contains__(self, name: object) -> bool:
        return name in self._blobs

    def __repr__(self) -> str:
        return f"{type(self).__name__}({sorted(self._blobs)})"


class PrivateWorkspace(Workspace):
    """The view a task in a PRIVATE group works in.

    Reads fall through to the node's workspace. Writes to names that exist there (or
    that the task declares as outputs) go to the node's workspace and persist; names
    first created here vanish when the task ends, as in Caffe2.

    Example::

        >>> node_ws = Workspace({"total": [100]})
        >>> view = PrivateWorkspace(node_ws, keep=())
        >>> view["tmp"] = 1
        >>> view["total"] = [101]
        >>> sorted(node_ws)  # 'tmp' stayed private
        ['total']
    """

    def __init__(self, parent: Workspace, keep: tuple[str, ...] | frozenset[str]) -> None:
        super().__init__()
        self._parent = parent
        self._keep = frozenset(keep)

    def __getitem__(self, name: str) -> np.ndarray:
        if name in self._blobs:
            return self._blobs[name]
        return self._parent[name]

    def __setitem__(self, name: str, value: object) -> None:
        if name in self._parent or name in self._keep:
            self._parent[name] = value
        else:
            super().__setitem__(name, value)

    def __delitem__(self, name: str) -> None:
        if name in self._blobs:
            del self._blobs[name]
        else:
            del self._parent[name]

    def __iter__(self) -> Iterator[str]:
        yield from self._parent
        yield from (name for name in self._blobs if name not in self._parent)

    def __len__(self) -> int:
        return len(self._parent) + sum(1 for name in self._blobs if name not in self._parent)

    def __contains__(self, name: object) -> bool:
        return name in self._blobs or name in self._parent
