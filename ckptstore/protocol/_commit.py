"""The commit protocol: how a save becomes visible, and only when it is complete.

For each node (:func:`write_node`)::

    1. data      the DB type writes every blob (on renaming storages, under a staging
                 name: ``.<node>.<epoch>.staging-<token>``)
    2. manifest  ``<db>/ckptstore.manifest.json``: every blob's dtype, shape and chunks
                 with a CRC-32C each, written after the data
    3. barrier   ``storage.sync()``: data and manifest are durable
    4. publish   renaming storages rename the staging prefix to ``<node>.<epoch>``;
                 object stores wrote in place (visibility comes from step 5)

For the epoch, once every node of the save reported success (:func:`commit_epoch`)::

    5. commit    ``_ckptstore/epoch-<N>.commit.json`` lists the nodes and their
                 manifests' CRC-32C; written last, atomically

Before a save overwrites an epoch, :func:`retract_epoch` removes the nodes being saved
from its commit record, so a crash part-way never leaves a committed epoch pointing at
half-written data. Readers (:func:`open_node`) accept a node's checkpoint only if the
commit record lists it and the manifest's CRC-32C matches: an epoch whose save did not
finish is invisible to ``load``, ``check_db_exists``, ``last_epoch`` and resume.

Example::

    >>> from ckptstore import LocalPath, NpzDB
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
import secrets
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from ckptstore._types import Array, JSONObject
from ckptstore.errors import (
    BlobNotFoundError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    JobConfigurationError,
    ObjectNotFoundError,
)
from ckptstore.execution._workspace import as_blob
from ckptstore.io._checksum import crc32c_of
from ckptstore.io._engine import ParallelIO
from ckptstore.plugin._db_type import DBLocation, DBType
from ckptstore.plugin._path_type import PathType
from ckptstore.records._documents import decode_document, encode_document, json_int, json_object
from ckptstore.records._layout import commit_record_key, manifest_key, staging_key
from ckptstore.records._manifest import NodeManifest
from ckptstore.records._names import get_ckpt_filename, validate_blob_name, validate_node_name

__all__ = [
    "EpochCommit",
    "NodeCommit",
    "commit_epoch",
    "committed_nodes",
    "is_complete",
    "newest_complete_before",
    "open_node",
    "open_node_record",
    "publish_node",
    "read_blobs",
    "read_commit",
    "require_commit",
    "retract_epoch",
    "verify_node",
    "write_node",
]

COMMIT_KIND = "ckptstore.commit"


@dataclass(frozen=True)
class NodeCommit:
    """One node's completed save, as recorded in the epoch's commit record."""

    node: str
    epoch: int
    db_type: str
    manifest_crc32c: int
    nbytes: int
    stored_bytes: int
    nblobs: int
    duration_ns: int = 0

    def encode(self) -> JSONObject:
        return {
            "db_type": self.db_type,
            "manifest_crc32c": self.manifest_crc32c,
            "nbytes": self.nbytes,
            "stored_bytes": self.stored_bytes,
            "nblobs": self.nblobs,
            "duration_ns": self.duration_ns,
        }

    @classmethod
    def decode(cls, node: str, epoch: int, raw: object) -> NodeCommit:
        if not isinstance(raw, dict):
            raise ValueError(f"node record {raw!r} is not a JSON object")
        return cls(
            node=validate_node_name(node),
            epoch=epoch,
            db_type=str(raw["db_type"]),
            manifest_crc32c=int(raw["manifest_crc32c"]),
            nbytes=int(raw["nbytes"]),
            stored_bytes=int(raw["stored_bytes"]),
            nblobs=int(raw["nblobs"]),
            duration_ns=int(raw.get("duration_ns", 0)),
        )


@dataclass(frozen=True)
class EpochCommit:
    """An epoch's commit record: the nodes whose save of that epoch completed."""

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
            epoch = json_int(document, "epoch")
            nodes = {
                name: NodeCommit.decode(name, epoch, raw)
                for name, raw in json_object(document, "nodes").items()
            }
            return cls(epoch, nodes, str(document["committed_at"]))
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise CorruptCheckpointError(
                f"commit record is malformed: {error}", url=url, file=key
            ) from None


# -- writing ---------------------------------------------------------------------------


def write_node(
    storage: PathType,
    node: str,
    epoch: int,
    blobs: Mapping[str, object],
    db_type: DBType,
    io: ParallelIO,
) -> NodeCommit:
    """Steps 1-4 for one node: data, manifest, durability barrier, publish."""
    started = time.perf_counter_ns()
    validate_node_name(node)
    arrays = {validate_blob_name(name): as_blob(name, value) for name, value in blobs.items()}
    for name, array in arrays.items():
        db_type.check_blob(name, array)
    if db_type.needs_rename and not storage.supports_rename:
        raise JobConfigurationError(
            f"DB type {db_type.name!r} works only on local disk, not on {storage.display_url}; "
            "use 'zarr' or 'npz' for object stores"
        )
    manifests: list[NodeManifest] = []

    def fill(root: str) -> bytes:
        written = db_type.write(DBLocation(storage, root, io), arrays)
        manifests.append(NodeManifest(node, epoch, db_type.name, written.blobs, written.files))
        return manifests[0].encode()

    manifest_bytes = publish_node(storage, get_ckpt_filename(node, epoch), fill)
    return NodeCommit(
        node=node,
        epoch=epoch,
        db_type=db_type.name,
        manifest_crc32c=crc32c_of([manifest_bytes]),
        nbytes=manifests[0].nbytes,
        stored_bytes=manifests[0].stored_bytes + len(manifest_bytes),
        nblobs=len(manifests[0].blobs),
        duration_ns=time.perf_counter_ns() - started,
    )


def publish_node(storage: PathType, db_key: str, fill: Callable[[str], bytes]) -> bytes:
    """Steps 1-4 around ``fill(root)``, which writes a node checkpoint's data under the
    key prefix ``root`` and returns its manifest's bytes. Returns those bytes."""
    if storage.supports_rename:
        for leftover in storage.staging_keys(db_key):
            storage.delete_tree(leftover)
        root = staging_key(db_key, secrets.token_hex(6))
    else:
        root = db_key
        _unpublish_in_place(storage, db_key)
    try:
        manifest_bytes = fill(root)
        storage.write_bytes(manifest_key(root), manifest_bytes)
        storage.sync()
        if storage.supports_rename:
            storage.replace_tree(root, db_key)
    except BaseException:
        if storage.supports_rename:
            with contextlib.suppress(Exception):
                storage.delete_tree(root)
        raise
    return manifest_bytes


def _unpublish_in_place(storage: PathType, db_key: str) -> None:
    """Before rewriting a node checkpoint in place, delete its manifest: from then on the
    old data is unreachable, and stale chunks of blobs that are gone are removed."""
    key = manifest_key(db_key)
    data = storage.get_document(key)
    if data is None:
        return
    storage.delete([key])
    try:
        old = NodeManifest.decode(data, url=storage.display_url, key=key)
    except CorruptCheckpointError:
        return
    stale = {chunk.key for record in old.blobs.values() for chunk in record.chunks}
    stale.update(chunk.key for chunk in old.files)
    storage.delete(f"{db_key}/{relative}" for relative in sorted(stale))


def retract_epoch(storage: PathType, epoch: int, nodes: Iterable[str]) -> None:
    """Remove ``nodes`` from ``epoch``'s commit record before they are saved again."""
    try:
        record = read_commit(storage, epoch)
    except CorruptCheckpointError:
        # unreadable, so none of its nodes is visible: clear it so the epoch can be saved
        storage.delete([commit_record_key(epoch)])
        return
    if record is None:
        return
    remaining = {name: c for name, c in record.nodes.items() if name not in set(nodes)}
    if remaining == dict(record.nodes):
        return
    key = commit_record_key(epoch)
    if remaining:
        storage.put_document(key, EpochCommit(epoch, remaining, record.committed_at).encode())
    else:
        storage.delete([key])


def commit_epoch(storage: PathType, epoch: int, commits: Sequence[NodeCommit]) -> EpochCommit:
    """Step 5: record that these nodes' saves of ``epoch`` are complete (merged with
    nodes committed earlier by other jobs sharing the prefix)."""
    try:
        existing = read_commit(storage, epoch)
    except CorruptCheckpointError:
        existing = None  # unreadable: none of its nodes was visible, it is replaced
    nodes = dict(existing.nodes) if existing is not None else {}
    nodes.update({commit.node: commit for commit in commits})
    record = EpochCommit(epoch, nodes, datetime.now(UTC).isoformat())
    storage.put_document(commit_record_key(epoch), record.encode())
    return record


# -- reading ---------------------------------------------------------------------------


def read_commit(storage: PathType, epoch: int) -> EpochCommit | None:
    """The commit record of ``epoch``, or ``None`` if no save of it completed."""
    key = commit_record_key(epoch)
    data = storage.get_document(key)
    if data is None:
        return None
    return EpochCommit.decode(data, url=storage.display_url, key=key)


def require_commit(
    storage: PathType, epoch: int, nodes: Iterable[str] | None = None, *, action: str | None = None
) -> EpochCommit:
    """The commit record of ``epoch``; with ``nodes``, it must list every one of them.

    Raises :class:`CheckpointNotFoundError` saying what is missing, that ``action``
    (``"catalog"``, ``"copy"``...) was refused, and how to list the committed epochs.
    """
    record = read_commit(storage, epoch)
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


def committed_nodes(storage: PathType, epoch: int) -> set[str]:
    """Names of the nodes whose checkpoint of ``epoch`` is committed."""
    record = read_commit(storage, epoch)
    return set(record.nodes) if record is not None else set()


def is_complete(storage: PathType, epoch: int, nodes: Iterable[str]) -> bool:
    """Whether ``epoch`` is committed on every one of ``nodes``."""
    return set(nodes) <= committed_nodes(storage, epoch)


def newest_complete_before(storage: PathType, epoch: int, nodes: Iterable[str]) -> int | None:
    """The newest epoch before ``epoch`` committed on every one of ``nodes``, or ``None``.

    Reads commit records one by one, newest first, without listing storage: the rare
    path after the chosen epoch turned out damaged.
    """
    wanted = set(nodes)
    for older in range(epoch - 1, -1, -1):
        if is_complete(storage, older, wanted):
            return older
    return None


def open_node(storage: PathType, node: str, epoch: int) -> NodeManifest:
    """The manifest of a committed node checkpoint, checked against the commit record."""
    return open_node_record(storage, node, epoch)[0]


def open_node_record(
    storage: PathType, node: str, epoch: int
) -> tuple[NodeManifest, bytes, NodeCommit]:
    """A committed node checkpoint's manifest, the manifest's exact bytes, and the
    node's entry in the commit record."""
    record = read_commit(storage, epoch)
    db_key = get_ckpt_filename(node, epoch)
    if record is None or node not in record.nodes:
        detail = (
            "no save of this epoch completed"
            if record is None
            else f"the epoch is committed only for {sorted(record.nodes)}"
        )
        raise CheckpointNotFoundError(
            storage.display_url,
            node,
            epoch,
            f"no committed checkpoint of node {node!r} for epoch {epoch} under "
            f"{storage.display_url} ({detail}). Run `ckptstore ls {storage.display_url}` to "
            "see the committed epochs, or resume from one of them.",
        )
    key = manifest_key(db_key)
    try:
        data = storage.read_bytes(key)
    except ObjectNotFoundError:
        raise CorruptCheckpointError(
            "the epoch is committed but the node's manifest is missing",
            url=storage.display_url,
            file=key,
        ) from None
    node_commit = record.nodes[node]
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
    return manifest, data, node_commit


def read_blobs(
    storage: PathType,
    manifest: NodeManifest,
    names: Iterable[str] | None,
    db_type: DBType,
    io: ParallelIO,
    *,
    missing_ok: bool = False,
) -> dict[str, Array]:
    """Read (and verify) blobs of a committed node checkpoint; only their bytes are read.

    ``names=None`` reads every blob. A requested name that the checkpoint lacks raises
    :class:`BlobNotFoundError` unless ``missing_ok``.
    """
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
    db = DBLocation(storage, get_ckpt_filename(manifest.node, manifest.epoch), io)
    return db_type.read(db, records)


def verify_node(
    storage: PathType, node: str, epoch: int, db_type: DBType, io: ParallelIO
) -> list[CorruptCheckpointError]:
    """Check every stored byte of a committed node checkpoint; one error per problem."""
    try:
        manifest = open_node(storage, node, epoch)
    except CorruptCheckpointError as error:
        return [error]
    db = DBLocation(storage, get_ckpt_filename(node, epoch), io)
    return db_type.verify(db, manifest)
