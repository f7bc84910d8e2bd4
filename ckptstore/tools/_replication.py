"""Copying committed epochs between checkpoint roots, and rewriting them in another
format. Used by ``ckptstore cp`` and ``ckptstore convert``.

Both go through the commit protocol: at the destination the epoch's nodes are retracted,
written (copies are verified against every checksum on the way), then committed.

Both report progress in bytes as chunks move (``on_bytes``): each node's stored bytes
once per pass over them (:func:`copy_passes`, :data:`CONVERT_PASSES`), a skipped node at
once.

Example::

    >>> from ckptstore import CheckpointManager, LocalSession
    >>> from ckptstore.builtin import LocalPath
    >>> session = LocalSession()
    >>> session.workspace("trainer_0")["w"] = np.ones(2)
    >>> manager = CheckpointManager("ckpt", "trainer_0", "npz")
    >>> _ = session.run(manager.init(["trainer_0"]))
    >>> for epoch in (3, 4):
    ...     _ = session.run(manager.save(epoch))
    >>> storage = LocalPath("ckpt")
    >>> archive = LocalPath("archive")  # an S3 or GCS path type works alike
    >>> [done.epoch for done in copy_epochs(storage, archive, [3, 4], jobs=4)]
    [3, 4]
    >>> [done.epoch for done in convert_epochs(storage, [4], "zarr")]
    [4]
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial

import numpy as np

from ckptstore import protocol
from ckptstore.errors import AlreadyCommittedError, JobConfigurationError
from ckptstore.io import ByteProgress, NodeProgress, ParallelIO
from ckptstore.plugin import DBType, PathType, get_registry
from ckptstore.protocol import CheckpointLocation, copy_node, refuse_unsafe_archives, require_commit
from ckptstore.tools._dcp_layout import METADATA_BLOB, METADATA_NODE, rebind_nodes

__all__ = ["CONVERT_PASSES", "NodeDone", "convert_epochs", "copy_epochs", "copy_passes"]

CONVERT_PASSES = 2
"""A conversion reads each node's stored bytes, then writes them again."""


def copy_passes(verify: bool) -> int:
    """How often a copy goes over each node's stored bytes: once to copy them, once
    more to read the copy back when ``verify``.

    Example::

        >>> copy_passes(verify=True), copy_passes(verify=False)
        (2, 1)
    """
    return 2 if verify else 1


@dataclass(frozen=True)
class NodeDone:
    """One node checkpoint copied, converted or skipped (already there).

    Example::

        >>> from ckptstore import CheckpointManager, LocalSession
        >>> from ckptstore.builtin import LocalPath
        >>> session = LocalSession()
        >>> session.workspace("trainer_0")["w"] = np.ones(2)
        >>> manager = CheckpointManager("source", "trainer_0", "npz")
        >>> _ = session.run(manager.init(["trainer_0"]))
        >>> for epoch in (3, 4):
        ...     _ = session.run(manager.save(epoch))
        >>> storage = LocalPath("source")
        >>> copied = copy_epochs(storage, LocalPath("backup"), [3])
        >>> sum(done.stored_bytes for done in copied if not done.skipped) > 0
        True
    """

    node: str
    epoch: int
    stored_bytes: int
    skipped: bool = False


Progress = Callable[[NodeDone], None]


def copy_epochs(
    source: PathType,
    dest: PathType,
    epochs: Iterable[int],
    *,
    jobs: int = 4,
    verify: bool = True,
    force: bool = False,
    on_done: Progress | None = None,
    on_bytes: ByteProgress | None = None,
) -> list[NodeDone]:
    """Copy each committed epoch's node checkpoints from ``source`` to ``dest`` (``jobs``
    nodes at a time) and commit them there. Nodes already committed at ``dest`` with the
    same manifest are skipped unless ``force``; one committed there with another manifest
    raises :class:`~ckptstore.errors.AlreadyCommittedError` unless ``force`` (then it is
    replaced). ``on_bytes`` hears bytes as chunks are
    copied and read back: ``copy_passes(verify)`` times each node's stored bytes. An
    epoch with a packed archive that ``verify --deep`` refuses
    (:func:`~ckptstore.protocol._archives.check_archives`) raises
    :class:`~ckptstore.errors.CorruptCheckpointError` before anything is copied."""
    settings = source.default_io.with_environment()
    passes = copy_passes(verify)
    done: list[NodeDone] = []
    for epoch in epochs:
        record = require_commit(source, epoch)
        for node in sorted(record.nodes):  # what verify --deep refuses is not copied
            refuse_unsafe_archives(source, node, epoch)
        existing = protocol.read_commit(dest, epoch)
        todo = []
        for node, commit in sorted(record.nodes.items()):
            there = existing.nodes.get(node) if existing is not None else None
            if not force and there is not None and there.manifest_crc32c == commit.manifest_crc32c:
                done.append(NodeDone(node, epoch, commit.stored_bytes, skipped=True))
                NodeProgress(on_bytes, passes * commit.stored_bytes).finish()
                if on_done is not None:
                    on_done(done[-1])
            else:
                todo.append(node)
        replaced = [n for n in todo if existing is not None and n in existing.nodes]
        if replaced and not force:  # another checkpoint of the epoch: never replaced silently
            raise AlreadyCommittedError(
                dest.display_url, epoch, replaced, hint="`ckptstore cp --force` replaces them"
            )
        if not todo:
            continue
        protocol.retract_epoch(dest, epoch, todo)

        copy = partial(_copy_one, source=source, dest=dest, epoch=epoch, verify=verify)
        locations = [
            CheckpointLocation(source, _db_type(record.nodes[node].db_type), settings)
            for node in todo
        ]
        progress = [
            NodeProgress(on_bytes, passes * record.nodes[node].stored_bytes) for node in todo
        ]
        commits = []
        with ThreadPoolExecutor(max(1, jobs), thread_name_prefix="ckptstore-cp") as pool:
            for commit, node_progress in zip(
                pool.map(copy, todo, locations, progress), progress, strict=True
            ):
                node_progress.finish()
                commits.append(commit)
                done.append(NodeDone(commit.node, epoch, commit.stored_bytes))
                if on_done is not None:
                    on_done(done[-1])
        protocol.commit_epoch(dest, epoch, commits)
    return done


def convert_epochs(
    storage: PathType,
    epochs: Iterable[int],
    db_type: str | DBType | None,
    *,
    dest: PathType | None = None,
    on_done: Progress | None = None,
    on_bytes: ByteProgress | None = None,
) -> list[NodeDone]:
    """Rewrite each committed epoch's node checkpoints in format ``db_type`` (``None``:
    each node in its own format, self-contained: what ``ckptstore cp --materialize``
    makes of incremental epochs), in place or into ``dest``. Nodes already in that
    format are skipped when converting in place.
    ``on_bytes`` hears bytes as chunks are read, then written: :data:`CONVERT_PASSES`
    times each node's stored bytes (the writes count what the new format stores, up to
    that).

    In place, an epoch's nodes are read (and verified) whole, retracted, rewritten and
    committed again; if a rewrite fails, the original blobs are written back in their
    format before the error is raised. Into ``dest``, an epoch is committed once every
    one of its nodes is written: a node that cannot be read (corrupt) leaves nothing of
    the epoch committed there."""
    target_type = None if db_type is None else get_registry().db_type(db_type)
    target = dest or storage
    if target_type is not None:
        _check_target(target_type, target)
    in_settings = storage.default_io.with_environment()
    out_settings = target.default_io.with_environment()
    done: list[NodeDone] = []
    for epoch in epochs:
        record = require_commit(storage, epoch)
        for node in sorted(record.nodes):  # what verify --deep refuses is not rewritten
            refuse_unsafe_archives(storage, node, epoch)
        commits = []
        manifests: dict[str, int] = {}  # a DCP epoch's node "dcp" goes last: it names them
        rewritten = False
        dcp = METADATA_NODE in record.nodes and all(
            node == METADATA_NODE or node.startswith("rank_") for node in record.nodes
        )
        ordered = sorted(record.nodes.items(), key=lambda n: (n[0] == METADATA_NODE, n[0]))
        for node, commit in ordered:
            progress = NodeProgress(on_bytes, CONVERT_PASSES * commit.stored_bytes)
            manifests[node] = commit.manifest_crc32c
            if (
                dest is None
                and target_type is not None
                and commit.db_type == target_type.name
                and not (dcp and node == METADATA_NODE and rewritten)
            ):
                done.append(NodeDone(node, epoch, commit.stored_bytes, skipped=True))
                progress.finish()
                if on_done is not None:
                    on_done(done[-1])
                continue
            source_type = _db_type(commit.db_type)
            node_type = target_type or source_type
            _check_target(node_type, target)
            manifest = protocol.open_node(storage, node, epoch)
            engine = ParallelIO(in_settings, progress=progress)
            blobs = protocol.read_blobs(storage, manifest, None, source_type, engine)
            if dcp and node == METADATA_NODE and METADATA_BLOB in blobs:
                raw = blobs[METADATA_BLOB].tobytes()
                document = rebind_nodes(raw, manifests, url=storage.display_url)
                blobs[METADATA_BLOB] = np.frombuffer(document, dtype=np.uint8)
            protocol.retract_epoch(target, epoch, [node])
            out_engine = ParallelIO(out_settings, progress=progress)
            try:
                result = protocol.write_node(target, node, epoch, blobs, node_type, out_engine)
            except BaseException:
                if dest is None:
                    original = protocol.write_node(
                        storage, node, epoch, blobs, source_type, engine.reporting(None)
                    )
                    protocol.commit_epoch(storage, epoch, [original])
                raise
            if dest is None:
                protocol.commit_epoch(target, epoch, [result])
            manifests[node], rewritten = result.manifest_crc32c, True
            progress.finish()
            commits.append(result)
            done.append(NodeDone(node, epoch, result.stored_bytes))
            if on_done is not None:
                on_done(done[-1])
        if dest is not None and commits:  # every node written: the epoch, all or nothing
            protocol.commit_epoch(target, epoch, commits)
    return done


def _copy_one(
    node: str,
    location: CheckpointLocation,
    progress: NodeProgress,
    *,
    source: PathType,
    dest: PathType,
    epoch: int,
    verify: bool,
) -> protocol.NodeCommit:
    stats = copy_node(
        source=location, dest=dest, node=node, epoch=epoch, verify=verify, progress=progress
    )
    assert stats.commit is not None, "copy_node always records the commit"
    return stats.commit


def _check_target(db_type: DBType, target: PathType) -> None:
    if db_type.needs_rename and not target.supports_rename:
        raise JobConfigurationError(
            f"DB type {db_type.name!r} works only on local disk, not on "
            f"{target.display_url}; convert into a local --dest, or pick 'zarr' or 'npz'"
        )


def _db_type(name: str) -> DBType:
    return get_registry().db_type(name)
