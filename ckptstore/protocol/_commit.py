"""The commit protocol: how a save becomes visible, and only when it is complete.

For each node (:func:`write_node`)::

    1. data      the DB type writes every blob under the save's own attempt
                 directory, ``<node>.<epoch>/attempt-<id>/`` (a fresh random id: no
                 other save writes, renames or deletes there)
    2. manifest  ``<attempt>/ckptstore.manifest.json``: every blob's dtype, shape and
                 chunks with a CRC-32C each, written after the data
    3. barrier   ``storage.sync()``: data, manifest and their directories are durable

For the epoch, once every node of the save reported success (:func:`commit_epoch`)::

    4. commit    ``_ckptstore/epoch-<N>/<node>.commit.json`` per node: the attempt it
                 commits and its manifest's CRC-32C; written last, with a create-only
                 write (:meth:`PathType.create_document`), so it is never replaced and
                 two writers can never both commit the same node and epoch

Nothing is renamed: the record alone says which attempt is the node's checkpoint, so
write-once holds from the create-only write, with or without a lease. The loser of a
race gets :class:`~ckptstore.errors.AlreadyCommittedError`, its attempt is deleted, and
no reader ever follows a record to it. Attempts no record names are garbage once
another attempt of their (node, epoch) is committed (:mod:`ckptstore.protocol._attempts`).

The epoch's commit record (:func:`read_commit`) is the union of its nodes' records, so
concurrent jobs committing different nodes of one epoch never lose each other's. A
committed (node, epoch) is write-once: a save of it fails at once with
:class:`~ckptstore.errors.AlreadyCommittedError` (:func:`check_not_committed`) unless
the caller asked to overwrite, in which case :func:`retract_epoch` first deletes the
nodes' records, so a crash part-way never leaves a committed epoch pointing at
half-written data. Readers (:func:`open_node`) follow the record to its attempt and
accept a node's checkpoint only if its record exists and the manifest's CRC-32C
matches: an epoch whose save did not finish is invisible to ``load``,
``check_db_exists``, ``last_epoch`` and resume.

With the node names given, reading a record is one GET per node (no listing); without
them, the epoch's record prefix is listed (operator tools only). The one-document
records of earlier versions (``_ckptstore/epoch-<N>.commit.json``) are still read, and
a record that names no attempt (earlier versions) points at ``<node>.<epoch>/``.

Example::

    >>> from ckptstore.builtin import LocalPath, NpzDB
    >>> from ckptstore.io import ParallelIO
    >>> storage = LocalPath("ckpt")
    >>> blobs = {"trainer_0/w": np.arange(3.0)}
    >>> commit = write_node(storage, "trainer_0", 3, blobs, NpzDB(), ParallelIO())
    >>> _ = commit_epoch(storage, 3, [commit])
    >>> manifest = open_node(storage, "trainer_0", 3)
    >>> manifest.blobs["trainer_0/w"].shape
    (3,)
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import partial

from ckptstore._types import Array
from ckptstore.errors import (
    AlreadyCommittedError,
    BlobNotFoundError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    JobConfigurationError,
    KeyExistsError,
    ObjectNotFoundError,
)
from ckptstore.execution import as_blob
from ckptstore.io import ParallelIO, crc32c_of, is_shared_key, paused_gc, run_together
from ckptstore.plugin import DBLocation, DBType, PathType
from ckptstore.protocol._bounds import check_decodable, check_pieces_fit, corrupt_in_node
from ckptstore.protocol._chunks import ChunkStore, release_intents
from ckptstore.protocol._incremental import check_frozen, check_incremental
from ckptstore.protocol._lease_document import LeaseFence
from ckptstore.protocol._location import CheckpointLocation, storage_of
from ckptstore.records import (
    MANIFEST_NAME,
    NodeCommit,
    NodeManifest,
    commit_record_key,
    decode_document,
    encode_document,
    epoch_commit_dir,
    get_ckpt_filename,
    json_object,
    manifest_key,
    new_attempt,
    node_commit_key,
    node_data_key,
    parse_node_commit_key,
    stored_int,
    validate_blob_name,
    validate_node_name,
)

__all__ = [
    "EpochCommit",
    "NodeCommit",
    "check_can_hold",
    "check_not_committed",
    "commit_epoch",
    "committed_nodes",
    "open_node",
    "open_node_record",
    "publish_node",
    "read_blobs",
    "read_commit",
    "read_commit_under",
    "read_listed_commit",
    "require_commit",
    "retract_epoch",
    "verify_node",
    "write_node",
]

log = logging.getLogger(__name__)

COMMIT_KIND = "ckptstore.commit"


@dataclass(frozen=True)
class EpochCommit:
    """An epoch's commit record: the nodes whose save of that epoch completed (the
    union of their per-node records; ``committed_at`` is the latest of theirs).
    ``encode``/``decode`` read and write the one-document form of earlier versions."""

    epoch: int
    nodes: Mapping[str, NodeCommit]
    committed_at: str

    @property
    def nbytes(self) -> int:
        return sum(node.nbytes for node in self.nodes.values())

    def encode(self) -> bytes:
        return encode_document(
            COMMIT_KIND,
            {
                "epoch": self.epoch,
                "committed_at": self.committed_at,
                "nodes": {name: node.encode() for name, node in sorted(self.nodes.items())},
            },
        )

    @classmethod
    def decode(cls, data: bytes, *, url: str, key: str) -> EpochCommit:
        document = decode_document(data, COMMIT_KIND, url=url, key=key)
        try:
            epoch = stored_int(document["epoch"])
            if not isinstance(document["nodes"], dict):
                raise ValueError("nodes is not an object")
            nodes = {
                name: NodeCommit.decode(name, epoch, raw)
                for name, raw in json_object(document, "nodes").items()
            }
            return cls(epoch, nodes, str(document["committed_at"]))
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            # InvalidNameError is a ValueError; the message is cut: stored text is untrusted
            raise CorruptCheckpointError(
                f"commit record is malformed: {type(error).__name__}", url=url, file=key
            ) from None


# -- writing ---------------------------------------------------------------------------


def check_can_hold(where: CheckpointLocation | PathType, db_type: DBType | None = None) -> None:
    """Refuse a format the storage cannot hold, before anything committed is touched.

    Raises :class:`~ckptstore.errors.JobConfigurationError` if ``db_type`` (default: a
    location's own) cannot be written at ``where``: a format that needs a renaming,
    local path type, such as LMDB, on an object store. A save calls it before it
    touches anything committed (an ``overwrite`` retracts the epoch first), and
    :func:`write_node` again."""
    storage = storage_of(where)
    if db_type is None:
        db_type, _ = _format_of(where, None, ParallelIO(), "check_can_hold")
    if db_type.needs_rename and not storage.supports_rename:
        raise JobConfigurationError(
            f"DB type {db_type.name!r} works only on local disk, not on {storage.display_url}; "
            "use 'zarr' or 'npz' for object stores"
        )


@paused_gc()
def write_node(
    where: CheckpointLocation | PathType,
    node: str,
    epoch: int,
    blobs: Mapping[str, object],
    db_type: DBType | None = None,
    io: ParallelIO | None = None,
    *,
    incremental: bool | None = None,
    frozen: Collection[str] = (),
) -> NodeCommit:
    """Write one node's checkpoint (steps 1-3), ready for :func:`commit_epoch`.

    Returns the node's commit, which :func:`commit_epoch` records: no one reads it back.
    ``where`` is a :class:`CheckpointLocation`, whose DB type, I/O settings and
    ``incremental`` flag are the defaults, or a bare path type (then ``db_type`` and
    ``io`` are needed).

    ``incremental``: the large blobs' chunks go to the root's chunk store, each stored
    once whatever the epochs and nodes holding it (:mod:`ckptstore.protocol._chunks`).
    The format must support it (``supports_incremental``). ``frozen`` (incremental
    only): names of blobs the caller promises are unchanged since this process's
    previous save of the node, whose bytes are then not read again (see
    :class:`~ckptstore.protocol._chunks.ChunkStore`); by default, those of the
    location's ``frozen`` this node holds."""
    storage = storage_of(where)
    db_type, io = _format_of(where, db_type, io, "write_node")
    if incremental is None:
        incremental = isinstance(where, CheckpointLocation) and where.incremental
    started = time.perf_counter_ns()
    validate_node_name(node)
    arrays = {validate_blob_name(name): as_blob(name, value) for name, value in blobs.items()}
    for name, array in arrays.items():
        db_type.check_blob(name, array)
    check_can_hold(storage, db_type)
    check_frozen(frozen, incremental=incremental)
    unknown = sorted(set(frozen) - set(arrays))
    if unknown:
        raise JobConfigurationError(f"frozen= names blobs this save does not hold: {unknown[:5]}")
    if not frozen and incremental and isinstance(where, CheckpointLocation):
        frozen = where.frozen & arrays.keys()  # the location's: for any node holding them
    shared = ChunkStore(storage, node, epoch, frozen=frozen) if incremental else None
    if shared is not None:
        check_incremental(db_type)
    manifests: list[NodeManifest] = []

    def fill(root: str) -> bytes:
        written = db_type.write(DBLocation(storage, root, io, shared), arrays)
        manifests.append(NodeManifest(node, epoch, db_type.name, written.blobs, written.files))
        return manifests[0].encode()

    attempt = new_attempt()
    try:
        manifest_bytes = publish_node(storage, node_data_key(node, epoch, attempt), fill)
    except BaseException:
        if shared is not None:
            with contextlib.suppress(Exception):
                shared.withdraw()
        raise
    if shared is not None:
        shared.remember()
    return NodeCommit(
        node=node,
        epoch=epoch,
        db_type=db_type.name,
        manifest_crc32c=crc32c_of([manifest_bytes]),
        # what the records add up to, without a dtype lookup and a product per blob (10,000: 3 ms)
        nbytes=sum(array.nbytes for array in arrays.values()),
        stored_bytes=manifests[0].stored_bytes + len(manifest_bytes),
        nblobs=len(manifests[0].blobs),
        duration_ns=time.perf_counter_ns() - started,
        shared_bytes=sum(
            chunk.stored
            for record in manifests[0].blobs.values()
            for chunk in record.chunks
            if is_shared_key(chunk.key)
        ),
        attempt=attempt,
    )


def _format_of(
    where: CheckpointLocation | PathType, db_type: DBType | None, io: ParallelIO | None, name: str
) -> tuple[DBType, ParallelIO]:
    """The DB type and I/O engine given, else ``where``'s (a location's own)."""
    if isinstance(where, CheckpointLocation):
        return db_type or where.db_type, io or where.engine()
    if db_type is None or io is None:
        raise JobConfigurationError(
            f"{name}() on a bare path type needs a DB type and an I/O engine: pass them, "
            "or pass the CheckpointLocation (CheckpointLocation.open(prefix, db_type))"
        )
    return db_type, io


def publish_node(
    where: CheckpointLocation | PathType, root: str, fill: Callable[[str], bytes]
) -> bytes:
    """Steps 1-3 around ``fill(root)``, which writes a node checkpoint's data under the
    key prefix ``root`` (a fresh attempt's, :func:`node_data_key`) and returns its
    manifest's bytes. Returns those bytes.

    Nothing is renamed or replaced: the data stays where it was written, invisible until
    a commit record names its attempt. If writing fails, the attempt is deleted (it is
    this save's alone: no other save writes under its name)."""
    storage = storage_of(where)
    # the attempt's directory and its parent get an entry each: make them durable with
    # the data (local disk; a no-op on object stores)
    storage.prepare_keys([manifest_key(root), f"{root.rsplit('/', 1)[0]}/{MANIFEST_NAME}"])
    try:
        manifest_bytes = fill(root)
        storage.write_bytes(manifest_key(root), manifest_bytes)
        storage.sync()
    except BaseException:
        with contextlib.suppress(Exception):
            storage.delete_tree(root)
            storage.remove_empty_directory(root.rpartition("/")[0])  # another save's stays
        raise
    return manifest_bytes


def check_not_committed(
    where: CheckpointLocation | PathType,
    epoch: int,
    nodes: Iterable[str],
    *,
    overwrite: bool = False,
    fence: LeaseFence | None = None,
    legacy: bool | None = None,
) -> None:
    """Before a save of ``nodes``' ``epoch``: committed checkpoints are write-once, so
    raise :class:`~ckptstore.errors.AlreadyCommittedError` if they are committed, or
    (``overwrite``) uncommit them first (:func:`retract_epoch`). One GET per node.
    ``legacy`` says whether a listing showed the epoch's one-document record of
    earlier versions (read then, one GET); ``None``: no listing was taken, so it is
    looked for when a node's record is missing.

    When only some of ``nodes`` are committed, the epoch was never complete for this
    save's nodes (a commit interrupted between two nodes' records, which no reader of
    these nodes accepts): those records are retracted with a warning and the save goes
    on, so an interrupted commit never blocks the next save of the epoch. So is an
    unreadable (corrupt) record, which no reader accepts either. So are, with a writer
    lease's ``fence``, records fenced out by it: written by a job this one took the
    lease over from, after the epoch this one resumed from (never committed)."""
    storage = storage_of(where)
    nodes = sorted({validate_node_name(node) for node in nodes})
    try:
        record = _read_records(storage, "", epoch, nodes, every=False, legacy=legacy)
    except CorruptCheckpointError as error:
        # unreadable: no reader accepts it, so nothing committed is replaced
        log.warning("Replacing the unreadable commit record of epoch %d: %s", epoch, error)
        try:
            retract_epoch(storage, epoch, nodes)
        except CorruptCheckpointError:
            # a link in place of the epoch's record directory (never followed): it
            # holds no record a reader accepts; the link itself is removed
            storage.delete([epoch_commit_dir(epoch)])
            retract_epoch(storage, epoch, nodes)
        return
    committed = set(record.nodes) if record is not None else set()
    if record is not None and fence is not None:
        stale = {
            node
            for node, commit in record.nodes.items()
            if fence.fenced_out(node, commit.lease_generation, epoch)
        }
        if stale:
            log.warning(
                "Saving over the commit records of epoch %d for %s under %s: a job that had "
                "lost the writer lease wrote them (fenced out)",
                epoch,
                sorted(stale),
                storage.display_url,
            )
            retract_epoch(storage, epoch, stale)
            committed -= stale
    if not committed:
        return
    if not overwrite and committed == set(nodes):
        raise AlreadyCommittedError(storage.display_url, epoch, committed)
    if not overwrite:
        log.warning(
            "Epoch %d under %s is committed for %s only, not for %s: an interrupted commit; "
            "retracting it and saving the epoch again",
            epoch,
            storage.display_url,
            sorted(committed),
            sorted(set(nodes) - committed),
        )
    retract_epoch(storage, epoch, nodes)


def retract_epoch(where: CheckpointLocation | PathType, epoch: int, nodes: Iterable[str]) -> None:
    """Uncommit ``nodes``' checkpoints of ``epoch`` (delete their commit records) before
    they are saved again or deleted; other nodes' records stay as they are."""
    storage = storage_of(where)
    names = set(nodes)
    storage.delete(node_commit_key(epoch, node) for node in sorted(names))
    key = commit_record_key(epoch)
    data = storage.get_document(key)
    if data is None:
        return
    try:
        record = EpochCommit.decode(data, url=storage.display_url, key=key)
    except CorruptCheckpointError:
        # unreadable, so none of its nodes is visible: clear it so the epoch can be saved
        storage.delete([key])
        return
    remaining = {name: c for name, c in record.nodes.items() if name not in names}
    if remaining == dict(record.nodes):
        return
    if remaining:
        storage.put_document(key, EpochCommit(epoch, remaining, record.committed_at).encode())
    else:
        storage.delete([key])


def commit_epoch(
    where: CheckpointLocation | PathType,
    epoch: int,
    commits: Sequence[NodeCommit],
    *,
    fence: LeaseFence | None = None,
) -> EpochCommit:
    """Step 5: create each node's commit record for ``epoch`` (create-only: nodes
    committed by other jobs sharing the prefix are untouched, and a node already
    committed raises :class:`~ckptstore.errors.AlreadyCommittedError`). Returns the
    record of these nodes. The last of ``commits`` is created once every other one
    exists (DCP's metadata node: its record makes the epoch visible); on an object
    store the others are created at once (each is a round trip).

    With a writer lease's ``fence``, the nodes' leases are read first and
    :class:`~ckptstore.errors.LeaseLostError` raised (nothing created) unless this job
    still holds them; each record carries the lease generation."""
    storage = storage_of(where)
    if fence is not None:
        fence.verify(storage, [commit.node for commit in commits])
        commits = [
            replace(commit, lease_generation=fence.generations.get(commit.node))
            for commit in commits
        ]
    committed_at = datetime.now(UTC).isoformat()
    commits = [replace(commit, committed_at=committed_at) for commit in commits]
    created: list[str] = []

    def create(commit: NodeCommit) -> None:
        try:
            storage.create_document(
                node_commit_key(epoch, commit.node), commit.encode_record(committed_at)
            )
        except KeyExistsError:
            raise AlreadyCommittedError(storage.display_url, epoch, [commit.node]) from None
        created.append(commit.node)

    try:
        firsts = commits[:-1]
        if not storage.batches_small_requests:  # round trips: at once
            run_together("ckptstore-commit", 16, [partial(create, commit) for commit in firsts])
        else:
            for commit in firsts:
                create(commit)
        for commit in commits[-1:]:  # the last once every other one exists
            create(commit)
    except BaseException:
        if created:  # the epoch stays invisible; leave no partial commit behind if we can
            with contextlib.suppress(Exception):
                storage.delete(node_commit_key(epoch, node) for node in created)
        with contextlib.suppress(Exception):
            _drop_lost_attempts(storage, epoch, commits)
        raise
    with contextlib.suppress(Exception):  # tidying only: a leftover intent keeps its chunks
        release_intents(storage, epoch, [commit.node for commit in commits])
    return EpochCommit(epoch, {commit.node: commit for commit in commits}, committed_at)


def _drop_lost_attempts(storage: PathType, epoch: int, commits: Sequence[NodeCommit]) -> None:
    """After a failed commit, delete the attempts of ``commits`` whose node is committed
    to another attempt: they lost and can never be committed. An attempt whose record is
    missing, or names it (a create that succeeded although it seemed to fail), stays:
    only a later commit of its node and epoch makes it garbage (``ckptstore gc``)."""
    attempts = {commit.node: commit for commit in commits if commit.attempt is not None}
    record = read_commit(storage, epoch, attempts) if attempts else None
    committed = {} if record is None else record.nodes
    for node, commit in attempts.items():
        if node in committed and committed[node].attempt != commit.attempt:
            storage.delete_tree(commit.data_key)


# -- reading ---------------------------------------------------------------------------


def read_commit(
    where: CheckpointLocation | PathType, epoch: int, nodes: Iterable[str] | None = None
) -> EpochCommit | None:
    """The commit record of ``epoch`` (the nodes whose save of it completed), or
    ``None`` if none did. With ``nodes``, only those are looked up, one GET each and no
    listing (the save and resume paths); without, the epoch's records are listed."""
    storage = storage_of(where)
    return read_commit_under(storage, "", epoch, nodes)


def read_commit_under(
    where: CheckpointLocation | PathType,
    prefix: str,
    epoch: int,
    nodes: Iterable[str] | None = None,
) -> EpochCommit | None:
    """:func:`read_commit` for the run at ``prefix`` under ``where`` (``""``: its root)."""
    storage = storage_of(where)

    if nodes is None:
        listed = storage.list_keys(_under(prefix, epoch_commit_dir(epoch)))
        parsed = (
            parse_node_commit_key(key[len(prefix) + 1 :] if prefix else key) for key in listed
        )
        names = {found[1] for found in parsed if found is not None and found[0] == epoch}
        if not names:
            _refuse_linked_records(storage, prefix, epoch)
        return _read_records(storage, prefix, epoch, names, every=True, legacy=True)
    names = {validate_node_name(node) for node in nodes}
    return _read_records(storage, prefix, epoch, names, every=False, legacy=None)


def read_listed_commit(
    where: CheckpointLocation | PathType, epoch: int, nodes: Iterable[str], *, legacy: bool
) -> EpochCommit | None:
    """The commit record of ``epoch`` from the records a listing of the control
    directory found: ``nodes``' per-node records (one GET each) and, with ``legacy``,
    every node of the one-document record of earlier versions (one GET)."""
    storage = storage_of(where)
    return _read_records(storage, "", epoch, nodes, every=True, legacy=legacy)


def _under(prefix: str, key: str) -> str:
    return f"{prefix}/{key}" if prefix else key


_PROBE_NODE = "_"
"""A node name no record is looked up for but by :func:`_refuse_linked_records`."""


def _refuse_linked_records(storage: PathType, prefix: str, epoch: int) -> None:
    """Raise :class:`CorruptCheckpointError` if ``epoch``'s record directory is a link.

    A listing leaves links out, so a linked ``_ckptstore/epoch-N`` lists no record,
    and the epoch would look uncommitted to ``verify`` and ``convert`` while a load
    (which reads the records by name) calls it corrupt. One read of a key under the
    directory refuses the link the way the load does; on an object store, or with no
    such directory, it finds nothing (one GET, only when the listing found no record)."""
    try:
        storage.get_document(_under(prefix, node_commit_key(epoch, _PROBE_NODE)))
    except CorruptCheckpointError as error:
        raise CorruptCheckpointError(
            error.detail, url=error.url, file=_under(prefix, epoch_commit_dir(epoch))
        ) from None


def _read_records(
    storage: PathType,
    prefix: str,
    epoch: int,
    nodes: Iterable[str],
    *,
    every: bool,
    legacy: bool | None,
) -> EpochCommit | None:
    """The per-node records of ``nodes`` (valid names; one GET each), merged with the one-document
    record of earlier versions if ``legacy`` (``None``: if a node's record is missing):
    all its nodes if ``every``, else only ``nodes``."""
    names = sorted(set(nodes))
    found: dict[str, NodeCommit] = {}
    stamps: list[str] = []
    for node in names:
        key = _under(prefix, node_commit_key(epoch, node))
        data = storage.get_document(key)
        if data is not None:
            found[node], stamp = NodeCommit.decode_record(
                data, url=storage.display_url, key=key, node=node, epoch=epoch
            )
            stamps.append(stamp)
    if legacy if legacy is not None else len(found) < len(names):
        record = _read_legacy(storage, _under(prefix, commit_record_key(epoch)), epoch)
        if record is not None:
            wanted = set(record.nodes) if every else set(names)
            for node, commit in record.nodes.items():
                if node in wanted and node not in found:
                    found[node] = commit
                    stamps.append(record.committed_at)
    if not found:
        return None
    return EpochCommit(epoch, dict(sorted(found.items())), max(stamps))


def _read_legacy(storage: PathType, key: str, epoch: int) -> EpochCommit | None:
    data = storage.get_document(key)
    if data is None:
        return None
    record = EpochCommit.decode(data, url=storage.display_url, key=key)
    if record.epoch != epoch:
        raise CorruptCheckpointError(
            "the commit record belongs to another epoch", url=storage.display_url, file=key
        )
    return record


def require_commit(
    where: CheckpointLocation | PathType,
    epoch: int,
    nodes: Iterable[str] | None = None,
    *,
    action: str | None = None,
    also: Iterable[str] = (),
) -> EpochCommit:
    """The commit record of ``epoch``; with ``nodes``, it must list every one of them.

    Raises :class:`CheckpointNotFoundError` saying what is missing, that ``action``
    (``"catalog"``, ``"copy"``...) was refused, and how to list the committed epochs.
    With ``nodes``, only their records, and those of ``also`` (nodes other jobs sharing
    the prefix committed, listed if still committed), are read: one GET each, no
    listing.
    """
    storage = storage_of(where)
    nodes = None if nodes is None else list(nodes)
    record = read_commit(storage, epoch, None if nodes is None else [*nodes, *also])
    missing = sorted(set(nodes or ()) - (set(record.nodes) if record is not None else set()))
    if record is None or missing:
        detail = f"lacks nodes {missing}" if record is not None else "does not exist"
        raise CheckpointNotFoundError(
            storage.display_url,
            None,
            epoch,
            f"{f'refusing to {action} epoch {epoch}: it' if action else f'epoch {epoch}'} "
            f"is not committed under {storage.display_url} (its commit record {detail}); "
            f"`ckptstore ls {storage.display_url}` lists the committed epochs",
        )
    return record


def committed_nodes(
    where: CheckpointLocation | PathType, epoch: int, nodes: Iterable[str] | None = None
) -> set[str]:
    """Names of the nodes whose checkpoint of ``epoch`` is committed (among ``nodes``,
    if given: one GET each, no listing)."""
    storage = storage_of(where)
    record = read_commit(storage, epoch, nodes)
    return set(record.nodes) if record is not None else set()


def open_node(where: CheckpointLocation | PathType, node: str, epoch: int) -> NodeManifest:
    """The manifest of a committed node checkpoint, checked against the commit record."""
    storage = storage_of(where)
    return open_node_record(storage, node, epoch)[0]


def open_node_record(
    where: CheckpointLocation | PathType, node: str, epoch: int
) -> tuple[NodeManifest, bytes, NodeCommit]:
    """A committed node checkpoint's manifest, the manifest's exact bytes, and the
    node's entry in the commit record."""
    storage = storage_of(where)
    with corrupt_in_node(storage, node, epoch):
        return _open_node_record(storage, node, epoch)


def _open_node_record(
    storage: PathType, node: str, epoch: int
) -> tuple[NodeManifest, bytes, NodeCommit]:
    record = read_commit(storage, epoch, [node])
    if record is None or node not in record.nodes:
        detail = "the node's save of this epoch is not committed"
        raise CheckpointNotFoundError(
            storage.display_url,
            node,
            epoch,
            f"no committed checkpoint of node {node!r} for epoch {epoch} under "
            f"{storage.display_url} ({detail}). Run `ckptstore ls {storage.display_url}` to "
            "see the committed epochs, or resume from one of them.",
        )
    node_commit = record.nodes[node]
    key = manifest_key(node_commit.data_key)
    try:
        data = storage.read_document(key)
    except ObjectNotFoundError:
        raise CorruptCheckpointError(
            "the epoch is committed but the node's manifest is missing",
            url=storage.display_url,
            file=key,
        ) from None
    if crc32c_of([data]) != node_commit.manifest_crc32c:
        raise CorruptCheckpointError(
            "the manifest's CRC-32C differs from the one in the commit record",
            url=storage.display_url,
            file=key,
        )
    manifest = NodeManifest.decode(data, url=storage.display_url, key=key)
    if manifest.node != node or manifest.epoch != epoch:
        raise CorruptCheckpointError(
            f"the manifest belongs to {manifest.node}.{manifest.epoch}",
            url=storage.display_url,
            file=key,
        )
    return replace(manifest, root=node_commit.data_key), data, node_commit


@paused_gc()
def read_blobs(
    where: CheckpointLocation | PathType,
    manifest: NodeManifest,
    names: Iterable[str] | None,
    db_type: DBType | None = None,
    io: ParallelIO | None = None,
    *,
    missing_ok: bool = False,
) -> dict[str, Array]:
    """Read blobs of a committed node checkpoint, checked against their checksums.

    Only the blobs' bytes are read: ``manifest`` is the one :func:`open_node` returned.
    ``names=None`` reads every blob. A requested name that the checkpoint lacks raises
    :class:`BlobNotFoundError` unless ``missing_ok``. With a :class:`CheckpointLocation`,
    the DB type that wrote the manifest and the location's I/O engine are the defaults.
    """
    storage = storage_of(where)
    if db_type is None and isinstance(where, CheckpointLocation):
        db_type = where.reader_for(manifest)
    db_type, io = _format_of(where, db_type, io, "read_blobs")
    wanted = list(manifest.blobs) if names is None else list(names)
    missing = [name for name in wanted if name not in manifest.blobs]
    if missing and not missing_ok:
        raise BlobNotFoundError(
            missing,
            f"checkpoint {get_ckpt_filename(manifest.node, manifest.epoch)} under "
            f"{storage.display_url}",
            f"it holds {len(manifest.blobs)} blobs; check the names (`ckptstore inspect`)",
        )
    records = [manifest.blobs[name] for name in wanted if name in manifest.blobs]
    whole = {record.name for record in records} == set(manifest.blobs)
    db = DBLocation(storage, manifest.data_key, io, whole=whole)
    with corrupt_in_node(storage, manifest.node, manifest.epoch):
        check_decodable(storage, records, db_type)
        check_pieces_fit(storage, db.root, (chunk for r in records for chunk in r.chunks))
        return db_type.read(db, records)


def verify_node(
    where: CheckpointLocation | PathType,
    node: str,
    epoch: int,
    db_type: DBType | None = None,
    io: ParallelIO | None = None,
    *,
    manifest: NodeManifest | None = None,
) -> list[CorruptCheckpointError]:
    """Check every stored byte of a committed node checkpoint; one error per problem.

    With a :class:`CheckpointLocation`, the DB type that wrote the node and the
    location's I/O engine are the defaults. ``manifest``: the node's manifest, if the
    caller already opened it (:func:`open_node`), so it is not read again."""
    storage = storage_of(where)
    if manifest is None:
        try:
            manifest = open_node(storage, node, epoch)
        except CorruptCheckpointError as error:
            return [error]
    if db_type is None and isinstance(where, CheckpointLocation):
        db_type = where.reader_for(manifest)
    db_type, io = _format_of(where, db_type, io, "verify_node")
    db = DBLocation(storage, manifest.data_key, io)
    pieces = [*(chunk for r in manifest.blobs.values() for chunk in r.chunks), *manifest.files]
    try:
        with corrupt_in_node(storage, node, epoch):
            check_decodable(storage, manifest.blobs.values(), db_type)
            check_pieces_fit(storage, db.root, pieces, missing_ok=True)
            problems = db_type.verify(db, manifest)
    except CorruptCheckpointError as error:
        return [error]
    return [problem.located(node=node, epoch=epoch) for problem in problems]
