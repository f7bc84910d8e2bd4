"""Garbage: node data that no commit record names and that can never be committed.

Every save writes its own attempt (``<node>.<epoch>/attempt-<id>/``) and a commit
record names the one attempt that is the node's checkpoint. The others are garbage:
the losers of a race, attempts of saves that failed or crashed, attempts an
``overwrite`` superseded, and the files an earlier version wrote at
``<node>.<epoch>/`` once an attempt of the same node and epoch is committed.

An attempt is collected only when its (node, epoch) is committed to *another* attempt:
its own writer can then never commit it (the record is created once), so nothing a
live writer may still need is deleted. The order makes this hold without a lock: the
node's data is listed *first*, its record read *after*. A writer that will still
commit must have retracted the record (``overwrite``) before it wrote its first byte,
so if its attempt was listed and the record read later still names another attempt,
that writer can only lose. An attempt of a (node, epoch) that is not committed is
never collected (a save may be writing it); a deleted epoch's attempts all go with
it (retention deletes ``<node>.<epoch>/`` whole).

Example::

    >>> from ckptstore.builtin import LocalPath, NpzDB
    >>> from ckptstore.io import ParallelIO
    >>> from ckptstore.protocol import commit_epoch, write_node
    >>> storage = LocalPath("garbage-demo")
    >>> blobs = {"w": np.arange(3.0)}
    >>> winner = write_node(storage, "trainer_0", 1, blobs, NpzDB(), ParallelIO())
    >>> loser = write_node(storage, "trainer_0", 1, blobs, NpzDB(), ParallelIO())
    >>> _ = commit_epoch(storage, 1, [winner])
    >>> [item.key == loser.data_key for item in find_garbage(storage)]
    [True]
    >>> collect_garbage(storage, find_garbage(storage))
    >>> find_garbage(storage)
    []
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ckptstore._types import JSONObject
from ckptstore.errors import CorruptCheckpointError, ObjectNotFoundError
from ckptstore.plugin import PathType
from ckptstore.protocol import _commit as protocol
from ckptstore.protocol._location import CheckpointLocation, storage_of
from ckptstore.records import node_data_key, parse_attempt_dir, parse_db_key

__all__ = ["Garbage", "NodeData", "collect_garbage", "find_garbage", "group_node_data"]


@dataclass
class NodeData:
    """What a listing found under one ``<node>.<epoch>/``: each attempt's keys, and the
    keys outside any attempt (the layout of earlier versions)."""

    node: str
    epoch: int
    attempts: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    loose: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Garbage:
    """One attempt (``key`` a prefix, deleted whole) or the files of an earlier
    version's layout (``files``) that no commit record names and none ever will."""

    node: str
    epoch: int
    key: str
    reason: str
    files: tuple[str, ...]
    stored_bytes: int

    def to_json(self) -> JSONObject:
        return {
            "node": self.node,
            "epoch": self.epoch,
            "key": self.key,
            "reason": self.reason,
            "files": len(self.files),
            "stored_bytes": self.stored_bytes,
        }


def group_node_data(keys: Iterable[str]) -> dict[tuple[str, int], NodeData]:
    """The keys of node data among ``keys`` (relative to a checkpoint root), by
    (node, epoch)."""
    found: dict[tuple[str, int], NodeData] = {}
    for key in keys:
        head, _, rest = key.partition("/")
        parsed = parse_db_key(head) if rest else None
        if parsed is None:
            continue
        data = found.setdefault(parsed, NodeData(*parsed))
        directory, _, inside = rest.partition("/")
        attempt = parse_attempt_dir(directory) if inside else None
        if attempt is None:
            data.loose.append(key)
        else:
            data.attempts[attempt].append(key)
    return found


def find_garbage(
    where: CheckpointLocation | PathType, nodes: Sequence[str] | None = None
) -> list[Garbage]:
    """Every piece of garbage under ``where``'s root (only ``nodes``' with them): one
    LIST of the root, then one GET per (node, epoch) found, after the listing."""
    storage = storage_of(where)
    grouped = group_node_data(storage.list_keys())
    garbage: list[Garbage] = []
    for (node, epoch), data in sorted(grouped.items()):
        if nodes is not None and node not in nodes:
            continue
        try:
            record = protocol.read_commit(storage, epoch, [node])
        except CorruptCheckpointError:
            continue  # a damaged record names nothing for sure: keep everything
        if record is None or node not in record.nodes:
            continue  # not committed: a save may still be writing any of it
        committed = record.nodes[node].attempt
        for attempt, keys in sorted(data.attempts.items()):
            if attempt != committed:
                reason = "lost a race or failed" if committed else "beside an earlier version's"
                garbage.append(
                    Garbage(
                        node,
                        epoch,
                        node_data_key(node, epoch, attempt),
                        f"not committed: {reason}; attempt {committed or '-'} is",
                        tuple(keys),
                        _sizes(storage, keys),
                    )
                )
        if committed is not None and data.loose:
            garbage.append(
                Garbage(
                    node,
                    epoch,
                    node_data_key(node, epoch, None),
                    f"an earlier version's files, superseded by attempt {committed}",
                    tuple(data.loose),
                    _sizes(storage, data.loose),
                )
            )
    return garbage


def collect_garbage(where: CheckpointLocation | PathType, garbage: Iterable[Garbage]) -> None:
    """Delete ``garbage`` (what :func:`find_garbage` found)."""
    storage = storage_of(where)
    for item in garbage:
        if parse_attempt_dir(item.key.rsplit("/", 1)[-1]) is not None:
            storage.delete_tree(item.key)  # an attempt: its directory, whole
        else:
            storage.delete(item.files)  # an earlier version's files, not its attempts


def _sizes(storage: PathType, keys: Iterable[str]) -> int:
    total = 0
    for key in keys:
        with contextlib.suppress(ObjectNotFoundError):  # removed since it was listed
            total += storage.size(key)
    return total
