"""What checkpoint tasks do on a node: plain functions of the node's workspace.

Managers build tasks from these with ``functools.partial``; everything bound in is
picklable, so a distributed session can run them on the worker holding the workspace,
reading and writing storage directly.

Example::

    >>> from functools import partial
    >>> from ckptstore import LocalSession, Task
    >>> from ckptstore.protocol import CheckpointLocation
    >>> location = CheckpointLocation.open("ckpt", "npz")
    >>> session = LocalSession()
    >>> session.workspace("trainer_0")["w"] = np.ones(2)
    >>> task = Task(partial(save_node, location=location, node="trainer_0", epoch=3,
    ...                     names=["w"]), node="trainer_0")
    >>> [stats.nblobs for stats in session.run(task)]  # written; commit_saves commits it
    [1]
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, TypeVar, cast

import numpy as np

from ckptstore import protocol
from ckptstore.checkpoint._peer_copies import note_saved, read_committed
from ckptstore.errors import (
    AlreadyCommittedError,
    BlobNotFoundError,
    SaveFailedError,
    is_disk_full,
    is_permanent,
)
from ckptstore.execution import Workspace
from ckptstore.io import paused_gc
from ckptstore.plugin import PathType
from ckptstore.protocol import CheckpointLocation, LeaseFence
from ckptstore.records import NodeStats, validate_blob_name

__all__ = [
    "NO_HOOKS",
    "Hooks",
    "NodeWork",
    "blobs_to_save",
    "check_not_committed",
    "commit_saves",
    "list_blob_names",
    "load_node",
    "node_exists",
    "partial_load",
    "read_blob_names",
    "run_alone",
    "save_arrays",
    "save_node",
]

_T = TypeVar("_T")


def list_blob_names(ws: Workspace) -> list[str]:
    """The names of every blob in the node's workspace, sorted (what init lists); a name
    no format could store raises :class:`InvalidNameError` here, before any save."""
    return sorted(validate_blob_name(name) for name in ws)


def read_blob_names(
    ws: Workspace, *, location: CheckpointLocation, node: str, epoch: int
) -> list[str]:
    """The blob names stored in a committed node checkpoint (from a peer copy when the
    session keeps one, see :mod:`ckptstore.checkpoint._peer_copies`)."""
    return read_committed(
        location,
        node,
        epoch,
        lambda storage: sorted(protocol.open_node(storage, node, epoch).blobs),
        last=False,
    )


def save_node(
    ws: Workspace,
    *,
    location: CheckpointLocation,
    node: str,
    epoch: int,
    names: Sequence[str],
) -> NodeStats:
    """Save the listed blobs as ``node``'s checkpoint of ``epoch``, uncommitted: the
    node's part of an epoch's save (see :func:`check_not_committed` and
    :func:`commit_saves` for what runs before and after every node's part)."""
    note_saved(location, node, epoch)
    return save_arrays(
        blobs_to_save(ws, node, epoch, names), location=location, node=node, epoch=epoch
    )


def blobs_to_save(
    ws: Mapping[str, np.ndarray[Any, Any]], node: str, epoch: int, names: Sequence[str]
) -> dict[str, np.ndarray[Any, Any]]:
    """The listed blobs of ``ws``; raises :class:`BlobNotFoundError` if any is gone."""
    missing = [name for name in names if name not in ws]
    if missing:
        raise BlobNotFoundError(
            missing,
            f"the workspace of the node saving {node}.{epoch}",
            "every blob listed when the manager was initialised must still exist at save time",
        )
    return {name: ws[name] for name in names}


def save_arrays(
    arrays: Mapping[str, np.ndarray[Any, Any]],
    *,
    location: CheckpointLocation,
    node: str,
    epoch: int,
) -> NodeStats:
    """Write ``arrays`` as ``node``'s checkpoint of ``epoch`` (what :func:`save_node`
    does once it has picked the blobs; asynchronous saves call it on staged copies).

    Returns the node's stats: with ``commit`` set on success, with ``error`` (and
    ``cause``) after a transient storage failure, for :func:`commit_saves` to judge.
    Permanent errors and a full disk raise at once, typed: retrying cannot fix them."""
    started = time.perf_counter_ns()
    try:
        result = protocol.write_node(location, node, epoch, arrays)
    except OSError as error:
        if is_permanent(error) or is_disk_full(error):
            raise  # typed, naming the path: retrying at once cannot fix it
        return NodeStats(
            node=node,
            epoch=epoch,
            db_path=location.db_path(node, epoch),
            action="checkpoint_save_failed",
            duration_ns=time.perf_counter_ns() - started,
            error=_describe(error),
            cause=error,
        )
    return NodeStats(
        node=node,
        epoch=epoch,
        db_path=location.db_path(node, epoch),
        action="checkpoint_save",
        duration_ns=time.perf_counter_ns() - started,
        nbytes=result.nbytes,
        stored_bytes=result.stored_bytes,
        nblobs=result.nblobs,
        blobs=tuple(arrays),
        commit=result,
    )


def check_not_committed(
    *,
    location: CheckpointLocation,
    epoch: int,
    nodes: Sequence[str],
    overwrite: bool,
    fence: LeaseFence | None = None,
    legacy: bool | None = None,
) -> None:
    """Before any node's part of an epoch's save: a format ``location`` cannot hold is
    refused (:func:`~ckptstore.protocol.check_can_hold`) before anything is retracted;
    committed checkpoints are write-once (:class:`~ckptstore.errors.AlreadyCommittedError`;
    ``overwrite`` uncommits them first; ``legacy``: see
    :func:`~ckptstore.protocol.check_not_committed`). A multi-node save's
    ``before_run``; a single-node save runs it in its task."""
    protocol.check_can_hold(location)
    with _failing(location.storage, epoch, nodes):
        protocol.check_not_committed(
            location, epoch, nodes, overwrite=overwrite, fence=fence, legacy=legacy
        )


def commit_saves(
    results: Sequence[object],
    *,
    storage: CheckpointLocation | PathType,
    epoch: int,
    fence: LeaseFence | None = None,
) -> list[NodeStats]:
    """After every node's part of the save of ``epoch`` ran: commit the epoch if all
    succeeded, else raise :class:`SaveFailedError` naming each failed node (the epoch
    stays invisible), chained to the first failure's error when this process holds it.
    Returns the nodes' stats, each with the commit just written (``commit``: its time
    and lease generation), so that no one reads it back. A multi-node save's
    ``after_run``; a single-node save runs it in its task. ``storage``: the location
    (or a bare path type, for a copy to an upload tier)."""
    storage = protocol.storage_of(storage)
    stats = [result for result in results if isinstance(result, NodeStats)]
    failed = [result for result in stats if result.error is not None]
    if failed:
        raise SaveFailedError(
            epoch, storage.display_url, {result.node: str(result.error) for result in failed}
        ) from next((result.cause for result in failed if result.cause is not None), None)
    with _failing(storage, epoch, [result.node for result in stats]):
        record = protocol.commit_epoch(
            storage, epoch, [result.commit for result in stats if result.commit], fence=fence
        )
    return [
        replace(result, commit=record.nodes[result.node]) if result.commit else result
        for result in stats
    ]


@contextmanager
def _failing(storage: PathType, epoch: int, nodes: Sequence[str]) -> Iterator[None]:
    """A transient storage error of the check or the commit fails the save of ``nodes``
    (:class:`SaveFailedError`, chained to it), as a node's failed write does; write-once
    refusals, permanent errors and a full disk raise as they are."""
    try:
        yield
    except (AlreadyCommittedError, SaveFailedError):
        raise
    except OSError as error:
        if is_permanent(error) or is_disk_full(error):
            raise
        failed = dict.fromkeys(nodes, _describe(error))
        raise SaveFailedError(epoch, storage.display_url, failed) from error


@dataclass(frozen=True)
class Hooks:
    """What runs before every node's part of an operation (``before()``) and after all
    of them (``after(results)``, which returns the results as they stand after it):
    a :class:`~ckptstore.execution.TaskGroup`'s hooks.

    Example::

        >>> Hooks(after=print).after is print
        True
    """

    before: Callable[[], None] | None = None
    after: Callable[[list[object]], Sequence[object]] | None = None


NO_HOOKS = Hooks()

NodeWork = Callable[[Workspace], object]
"""A node's part of an operation: a function of its workspace."""


def run_alone(ws: Workspace, *, work: Callable[[Workspace], _T], hooks: Hooks) -> _T:
    """``work`` on this node as a group of one: ``hooks.before()``, the work, then
    ``hooks.after([result])``, as a :class:`~ckptstore.execution.TaskGroup` runs its
    hooks around its tasks (a single-node manager returns one Task, as in Caffe2).
    Returns the result as ``hooks.after`` returned it (a save's: with its commit)."""
    if hooks.before is not None:
        hooks.before()
    result = work(ws)
    if hooks.after is not None:
        (result,) = cast("Sequence[_T]", hooks.after([result]))
    return result


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


@paused_gc()
def load_node(
    ws: Workspace,
    *,
    location: CheckpointLocation,
    node: str,
    epoch: int,
    names: Sequence[str] | None,
) -> NodeStats:
    """Load every listed blob (``None``: every stored one) from ``node``'s checkpoint of
    ``epoch`` into ``ws``, opening it once. All blobs are read and verified before any
    is replaced: a failed load changes nothing. A peer copy the session keeps is read
    instead of the root when it passes the same checks
    (:func:`~ckptstore.checkpoint._peer_copies.read_committed`)."""
    started = time.perf_counter_ns()

    def read(storage: PathType) -> dict[str, np.ndarray[Any, Any]]:
        manifest = protocol.open_node(storage, node, epoch)
        return protocol.read_blobs(
            storage, manifest, names, location.reader_for(manifest), location.engine()
        )

    arrays = read_committed(location, node, epoch, read)
    ws.update(arrays)
    return _read_stats(location, node, epoch, "checkpoint_load", started, arrays)


def partial_load(
    ws: Workspace,
    *,
    location: CheckpointLocation,
    nodes: Sequence[str],
    epoch: int,
    names: Sequence[str],
) -> list[NodeStats]:
    """Gather the requested blobs from several nodes' checkpoints of ``epoch`` into this
    node's workspace (a node's checkpoint contributes the names it holds; when several
    hold a name, the last node wins, as in Caffe2). Every name must be found somewhere;
    nothing is assigned unless all reads succeed."""
    gathered: dict[str, np.ndarray[Any, Any]] = {}
    stats = []
    for node in nodes:
        started = time.perf_counter_ns()
        manifest = protocol.open_node(location, node, epoch)
        wanted = [name for name in names if name in manifest.blobs]
        arrays = protocol.read_blobs(location, manifest, wanted)
        gathered.update(arrays)
        stats.append(_read_stats(location, node, epoch, "checkpoint_partial_load", started, arrays))
    missing = [name for name in names if name not in gathered]
    if missing:
        raise BlobNotFoundError(
            missing,
            f"the epoch {epoch} checkpoints of nodes {list(nodes)} under "
            f"{location.storage.display_url}",
            "check the blob names (`ckptstore inspect URL --epoch N` lists them)",
        )
    ws.update(gathered)
    return stats


def node_exists(ws: Workspace, *, location: CheckpointLocation, node: str, epoch: int) -> bool:
    """Whether ``node``'s checkpoint of ``epoch`` is committed."""
    return node in protocol.committed_nodes(location, epoch, [node])


def _read_stats(
    location: CheckpointLocation,
    node: str,
    epoch: int,
    action: str,
    started: int,
    arrays: dict[str, np.ndarray[Any, Any]],
) -> NodeStats:
    return NodeStats(
        node=node,
        epoch=epoch,
        db_path=location.db_path(node, epoch),
        action=action,
        duration_ns=time.perf_counter_ns() - started,
        nbytes=sum(array.nbytes for array in arrays.values()),
        nblobs=len(arrays),
        blobs=tuple(arrays),
    )
