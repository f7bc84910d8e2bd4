"""What checkpoint tasks do on a node: plain functions of the node's workspace.

Managers build tasks from these with ``functools.partial``; everything bound in is
picklable, so a distributed session can run them on the worker holding the workspace,
reading and writing storage directly.

Example::

    Task(partial(save_node, location=location, node="trainer_0", epoch=3,
                 names=["w"], commit=True))
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ckptstore import protocol
from ckptstore.errors import (
    AlreadyCommittedError,
    BlobNotFoundError,
    SaveFailedError,
    is_disk_full,
    is_permanent,
)
from ckptstore.execution._workspace import Workspace
from ckptstore.io import paused_gc
from ckptstore.plugin._path_type import PathType
from ckptstore.protocol._location import CheckpointLocation
from ckptstore.records._names import validate_blob_name
from ckptstore.records._stats import NodeStats

__all__ = [
    "blobs_to_save",
    "commit_saves",
    "list_blob_names",
    "load_node",
    "node_exists",
    "partial_load",
    "read_blob_names",
    "save_arrays",
    "save_node",
]


def list_blob_names(ws: Workspace) -> list[str]:
    """The names of every blob in the node's workspace, sorted (what init lists); a name
    no format could store raises :class:`InvalidNameError` here, before any save."""
    return sorted(validate_blob_name(name) for name in ws)


def read_blob_names(
    ws: Workspace, *, location: CheckpointLocation, node: str, epoch: int
) -> list[str]:
    """The blob names stored in a committed node checkpoint."""
    return sorted(protocol.open_node(location.storage, node, epoch).blobs)


def save_node(
    ws: Workspace,
    *,
    location: CheckpointLocation,
    node: str,
    epoch: int,
    names: Sequence[str],
    commit: bool,
    overwrite: bool = False,
) -> NodeStats:
    """Save the listed blobs as ``node``'s checkpoint of ``epoch``. With ``commit`` (a
    single-node save) the node must not be committed for ``epoch`` yet
    (:class:`~ckptstore.errors.AlreadyCommittedError`; ``overwrite`` uncommits it
    first), and it is committed after."""
    return save_arrays(
        blobs_to_save(ws, node, epoch, names),
        location=location,
        node=node,
        epoch=epoch,
        commit=commit,
        overwrite=overwrite,
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
    commit: bool,
    overwrite: bool = False,
) -> NodeStats:
    """Save ``arrays`` as ``node``'s checkpoint of ``epoch`` (what :func:`save_node`
    does once it has picked the blobs; asynchronous saves call it on staged copies)."""
    started = time.perf_counter_ns()
    storage = location.storage
    try:
        if commit:
            protocol.check_not_committed(storage, epoch, [node], overwrite=overwrite)
        result = protocol.write_node(
            storage,
            node,
            epoch,
            arrays,
            location.db_type,
            location.engine(),
        )
        if commit:
            protocol.commit_epoch(storage, epoch, [result])
    except AlreadyCommittedError:
        raise  # write-once: not a storage failure to retry or count
    except OSError as error:
        if is_permanent(error) or is_disk_full(error):
            raise  # typed, naming the path: retrying at once cannot fix it
        if commit:
            raise SaveFailedError(epoch, storage.display_url, {node: _describe(error)}) from error
        return NodeStats(
            node=node,
            epoch=epoch,
            db_path=location.db_path(node, epoch),
            action="checkpoint_save_failed",
            duration_ns=time.perf_counter_ns() - started,
            error=_describe(error),
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


def commit_saves(results: Sequence[NodeStats], *, storage: PathType, epoch: int) -> None:
    """After every node's save of ``epoch`` ran: commit the epoch if all succeeded, else
    raise :class:`SaveFailedError` naming each failed node (the epoch stays invisible)."""
    failed = {stats.node: stats.error for stats in results if stats.error is not None}
    if failed:
        raise SaveFailedError(epoch, storage.display_url, failed)
    protocol.commit_epoch(
        storage, epoch, [stats.commit for stats in results if stats.commit is not None]
    )


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


@paused_gc()
def load_node(
    ws: Workspace,
    *,
    location: CheckpointLocation,
    node: str,
    epoch: int,
    names: Sequence[str],
) -> NodeStats:
    """Load every listed blob from ``node``'s checkpoint of ``epoch`` into ``ws``. All
    blobs are read and verified before any is replaced: a failed load changes nothing."""
    started = time.perf_counter_ns()
    manifest = protocol.open_node(location.storage, node, epoch)
    arrays = protocol.read_blobs(
        location.storage, manifest, names, location.reader_for(manifest), location.engine()
    )
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
        manifest = protocol.open_node(location.storage, node, epoch)
        wanted = [name for name in names if name in manifest.blobs]
        arrays = protocol.read_blobs(
            location.storage, manifest, wanted, location.reader_for(manifest), location.engine()
        )
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
    return node in protocol.committed_nodes(location.storage, epoch, [node])


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
