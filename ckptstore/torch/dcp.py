"""ckptstore as the storage of ``torch.distributed.checkpoint`` (DCP).

:class:`Writer` and :class:`Reader` are DCP's ``StorageWriter`` and ``StorageReader``
over any ckptstore root (local disk, ``s3://``, ``gs://`` with their plugins). DCP plans
the save and the load (sharding, deduplication, resharding); ckptstore stores the bytes
and decides what is committed::

    dcp.save(state, storage_writer=Writer("s3://bucket/run", epoch=7))
    dcp.load(state, storage_reader=Reader("s3://bucket/run"))  # the newest epoch

Layout and commit (docs/design.md, "DCP checkpoints"): each rank's items are the node
checkpoint ``rank_<r>.<epoch>`` (format zarr: packed archives, a CRC per piece of at
most ``chunk_bytes``); DCP's global metadata is a JSON document (never pickle) in the
node ``dcp.<epoch>``, written by the coordinator once every rank's data is durable, and
only then is every node's create-once commit record written, the ``dcp`` node's last.
An epoch is visible when its ``dcp`` node is committed. The coordinator takes the
writer lease of the node ``dcp`` while the ranks write (in a thread started by the
global plan) and holds it to the commit, so two jobs saving under one root never
interleave their commits; a committed epoch is never written again
(:class:`~ckptstore.errors.AlreadyCommittedError`).

Loading reads, for each saved chunk a rank needs, only the stored pieces overlapping
the part it needs (ranged reads), each checked against its CRC; a damaged byte raises
:class:`~ckptstore.errors.CorruptCheckpointError` naming the file and the tensor (DCP
reports a rank's failure as its ``CheckpointException``, whose ``failures`` hold it).
Non-tensor entries, which DCP's planner pickles with ``torch.save``, are stored as opaque
bytes; on load they are first checked with ``torch.load(weights_only=True)`` (unless
``allow_pickle=True``) before DCP's planner unpickles them.

Example::

    >>> import torch
    >>> import torch.distributed.checkpoint as dcp
    >>> from ckptstore.torch.dcp import Reader, Writer
    >>> state = {"w": torch.arange(6.0).reshape(2, 3), "step": 7}
    >>> _ = dcp.save(state, storage_writer=Writer("./dcp-ckpt", epoch=7), no_dist=True)
    >>> loaded = {"w": torch.zeros(2, 3), "step": 0}
    >>> dcp.load(loaded, storage_reader=Reader("./dcp-ckpt"), no_dist=True)
    >>> loaded["step"], torch.equal(loaded["w"], state["w"])
    (7, True)
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import io
import logging
import os
import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from ckptstore.errors import (
    AlreadyCommittedError,
    CheckpointNotFoundError,
    CkptStoreError,
    CorruptCheckpointError,
    InvalidNameError,
    JobConfigurationError,
    UnsupportedBlobError,
)
from ckptstore.io import kept_pool, paused_gc
from ckptstore.protocol import (
    CheckpointLocation,
    CommitListing,
    NodeCommit,
    WriterLease,
    check_can_hold,
    check_incremental,
    commit_epoch,
    committed_nodes,
    open_node,
    open_node_record,
    read_blobs,
    retract_epoch,
    write_node,
)
from ckptstore.records import BlobRecord, NodeManifest, validate_blob_name
from ckptstore.tools import METADATA_BLOB, METADATA_NODE, metadata_bytes
from ckptstore.torch._adapter import TorchAdapter
from ckptstore.torch._dcp_incremental import IncrementalItem, intents_of, release_intents_of
from ckptstore.torch._dcp_load import (
    Want,
    bytes_of,
    check_records,
    engine_for,
    plain,
    read_in_waves,
)
from ckptstore.torch._dcp_metadata import (
    DecodedMetadata,
    StoredItem,
    decode_metadata,
    encode_metadata,
    item_key,
)
from ckptstore.torch._dcp_read import Partial, box_of, covering, in_tensor
from ckptstore.tree import encode_segment

__all__ = [
    "CHUNK_BYTES",
    "METADATA_BLOB",
    "METADATA_NODE",
    "Reader",
    "Writer",
    "rank_node",
    "typed_errors",
]

CHUNK_BYTES = 128 << 10
"""Default size of the pieces each saved chunk is stored (and CRC-checked) in: a load
reads, per saved chunk it touches, the pieces between the first and last element it
needs there (for rows of a dim-0 shard, at most two pieces more than those rows)."""

log = logging.getLogger(__name__)
T = TypeVar("T")
Wanted = tuple[NodeManifest, list[tuple[ReadItem, str]]]
"""A node checkpoint's manifest and the items read from it (with their blobs)."""


def rank_node(rank: int) -> str:
    """The node checkpoint holding rank ``rank``'s items (``rank_<r>``)."""
    return f"rank_{rank}"


def _blob_name(index: MetadataIndex) -> str:
    """``<key>`` for a byte entry, ``<key>#<offsets>`` for a tensor chunk (``#`` never
    appears in an encoded key, so the two cannot collide). A name longer than a blob
    name may be keeps its start and ends with a hash of the whole (``~<hash>``); the
    metadata maps every item to its blob, so the name need only be unique."""
    name = encode_segment(index.fqn)
    if index.offset is not None:
        name = f"{name}#{','.join(str(o) for o in index.offset)}"
    try:
        return validate_blob_name(name)
    except InvalidNameError:  # too long: encoded keys hold only safe ASCII characters
        digest = hashlib.blake2b(name.encode(), digest_size=16).hexdigest()
        return f"{name[:64]}~{digest}"


def _stored_at(record: BlobRecord) -> tuple[str, int]:
    """Where ``record``'s first piece is stored: reading in this order reads each file
    front to back, neighbours in one request."""
    return (record.chunks[0].key, record.chunks[0].offset) if record.chunks else ("", 0)


def _open(
    root: str | os.PathLike[str],
    storage_options: Mapping[str, object] | None,
    chunk_bytes: int | None,
) -> CheckpointLocation:
    location = CheckpointLocation.open(os.fspath(root), "zarr", storage_options=storage_options)
    if chunk_bytes is None:
        return location
    settings = replace(location.io_settings, chunk_bytes=chunk_bytes)
    return replace(location, io_settings=settings, _others={})


def _epoch(epoch: object) -> int:
    if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
        raise JobConfigurationError(f"epoch must be a non-negative int, not {epoch!r}")
    return epoch


def _no_checkpoint_id(checkpoint_id: str | os.PathLike[str] | None, what: str) -> None:
    if checkpoint_id is not None:
        raise JobConfigurationError(
            f"a ckptstore {what} is given its root and epoch when made; call DCP without "
            f"checkpoint_id (got {checkpoint_id!r}), or make a new {what} for another root"
        )


def _done(value: T) -> Future[T]:
    future: Future[T] = Future()
    future.set_result(value)
    return future


LEASE_THREAD = "ckptstore-dcp-lease"
"""The one thread of a process that takes and releases DCP writer leases, in the order
asked (:func:`~ckptstore.io.kept_pool`): a save's take runs after every earlier save's
release, and the thread ends a release before the process exits."""


def _released_before() -> None:
    """Wait for this process's lease releases still in flight."""
    kept_pool(LEASE_THREAD, 1).submit(lambda: None).result()


@contextmanager
def typed_errors() -> Iterator[None]:
    """Raise a ckptstore error that a rank raised inside DCP as itself (the first one,
    by rank), instead of DCP's ``CheckpointException`` wrapping it; any other
    ``CheckpointException`` passes through unchanged.

    Example::

        >>> import torch.distributed.checkpoint as dcp
        >>> from fractions import Fraction
        >>> _ = dcp.save({"f": Fraction(1, 3)}, storage_writer=Writer("./t", epoch=1), no_dist=True)
        >>> with typed_errors():  # a class torch.load(weights_only=True) refuses
        ...     dcp.load({"f": None}, storage_reader=Reader("./t"), no_dist=True)
        Traceback (most recent call last):
        ckptstore.errors.UnsupportedBlobError: ...
    """
    try:
        yield
    except CheckpointException as wrapped:
        for rank in sorted(wrapped.failures):
            error = wrapped.failures[rank][0]
            if isinstance(error, CkptStoreError):
                raise error from wrapped
        raise


class Writer(StorageWriter):
    """DCP's storage writer for one save of ``epoch`` under ``root``.

    Make a new one per save. Raises :class:`~ckptstore.errors.AlreadyCommittedError`
    if ``epoch`` is committed under ``root`` (write-once), and the usual ckptstore
    errors for a root or ``storage_options`` it cannot open. ``chunk_bytes`` is the
    size of the CRC-checked pieces saved chunks are cut into (see :data:`CHUNK_BYTES`).
    ``incremental=True`` stores each 4 MiB chunk of items of 1 MiB or more once per
    content in the root's chunk store, writing only those not already there (docs/
    torch-and-trees.md, "Write only what changed"; the pieces of those items are then
    the chunk store's 4 MiB chunks).

    Example::

        >>> import torch
        >>> import torch.distributed.checkpoint as dcp
        >>> _ = dcp.save({"w": torch.ones(3)}, storage_writer=Writer("./w", epoch=1), no_dist=True)
        >>> Writer("./w", epoch=1)
        Traceback (most recent call last):
        ckptstore.errors.AlreadyCommittedError: epoch 1 is already committed ...
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        epoch: int,
        storage_options: Mapping[str, object] | None = None,
        *,
        chunk_bytes: int = CHUNK_BYTES,
        incremental: bool = False,
    ) -> None:
        super().__init__()
        self.epoch = _epoch(epoch)
        self.location = _open(root, storage_options, chunk_bytes)
        self.storage = self.location.storage
        check_can_hold(self.location)
        self.incremental = incremental
        if incremental:
            check_incremental(self.location.db_type)
        if committed_nodes(self.location, self.epoch, [METADATA_NODE]):
            raise AlreadyCommittedError(self.storage.display_url, self.epoch, [METADATA_NODE])
        self.is_coordinator = False
        self.rank = 0
        self._lease: WriterLease | None = None
        self._taking: concurrent.futures.Future[None] | None = None
        self._adapter = TorchAdapter()

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        _no_checkpoint_id(checkpoint_id, "Writer")

    def set_up_storage_writer(self, is_coordinator: bool, *args: object, **kwargs: object) -> None:
        self.is_coordinator = is_coordinator
        rank = kwargs.get("rank")
        if not isinstance(rank, int):
            rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        self.rank = rank

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        """On the coordinator: start taking the root's DCP writer lease, then checking
        again, under it, that the epoch is not committed, on the lease thread while
        the ranks write (on an object store these are six round trips in a row, 0.36 s
        of a 2.3 s save to moto +20 ms). The coordinator's ``write_data`` waits for it
        before handing its results on, so nothing is committed without it, and a
        failure (``LeaseHeldError``, ``AlreadyCommittedError``) fails the save there;
        the data written meanwhile is never visible (an attempt no record names)."""
        self._taking = kept_pool(LEASE_THREAD, 1).submit(self._take_lease)
        return plans

    def _take_lease(self) -> None:
        lease = WriterLease(self.location, [METADATA_NODE])
        lease.acquire()
        self._lease = lease
        weakref.finalize(self, lease.release)  # a save that failed elsewhere lets go
        try:
            committed = committed_nodes(self.location, self.epoch)  # one listing: every node's
            if METADATA_NODE in committed:
                raise AlreadyCommittedError(self.storage.display_url, self.epoch, [METADATA_NODE])
            # ranks committed without the metadata node: a commit cut short, never visible
            stale = {n for n in committed if n.startswith("rank_")}
            if stale:
                log.warning(
                    "Epoch %d under %s has commit records for %s but none for its DCP "
                    "metadata: an interrupted commit; retracting them and saving again",
                    self.epoch,
                    self.storage.display_url,
                    sorted(stale),
                )
                retract_epoch(self.location, self.epoch, stale)
        except BaseException:
            self._release()
            raise

    def _lease_taken(self, commit: NodeCommit | None) -> None:
        """On the coordinator, once its own items are written: wait for the lease taken
        in the background (:meth:`prepare_global_plan`); if that failed, delete this
        rank's attempt (``commit``: it is this save's alone) and raise why."""
        taking, self._taking = self._taking, None
        if taking is None:
            return
        try:
            taking.result()
        except BaseException:
            if commit is not None:
                with contextlib.suppress(Exception):
                    self.storage.delete_tree(commit.data_key)
            raise

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        """Write this rank's items as its node checkpoint (not committed yet); on the
        coordinator, then wait for the writer lease (:meth:`prepare_global_plan`)."""
        if not plan.items:
            self._lease_taken(None)
            return _done([])
        try:
            return self._write_items(plan, planner)
        except BaseException:
            with contextlib.suppress(Exception):  # the save failed already: why matters
                self._lease_taken(None)
            raise

    def _write_items(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        node = rank_node(self.rank)
        blobs: dict[str, object] = {}
        names: list[str] = []
        sizes: list[int] = []
        for item in plan.items:
            data = planner.resolve_data(item)
            if item.type == WriteItemType.BYTE_IO:
                if not isinstance(data, io.BytesIO):
                    raise UnsupportedBlobError(item.index.fqn, "a byte item is not a BytesIO")
                array = np.frombuffer(data.getbuffer(), dtype=np.uint8).copy()
            else:
                if not isinstance(data, torch.Tensor):
                    raise UnsupportedBlobError(item.index.fqn, "a tensor item is not a tensor")
                converted = self._adapter.to_numpy(data.detach().cpu().contiguous())
                if converted is None:
                    raise UnsupportedBlobError(item.index.fqn, "a tensor item is not a tensor")
                array = converted[0]
            names.append(_blob_name(item.index))
            blobs[names[-1]] = array
            sizes.append(array.nbytes)
        commit = write_node(self.location, node, self.epoch, blobs, incremental=self.incremental)
        self._lease_taken(commit)
        intents = intents_of(self.storage, node, self.epoch) if self.incremental else ()
        return _done(
            [
                WriteResult(
                    index=item.index,
                    size_in_bytes=size,
                    storage_data=IncrementalItem(node, name, commit, intents)
                    if intents
                    else StoredItem(node, name, commit),
                )
                for item, name, size in zip(plan.items, names, sizes, strict=True)
            ]
        )

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """On the coordinator, once every rank's data is durable: write the metadata
        node, then create every node's commit record (the metadata node's last)."""
        try:
            stored = [(result.index, result.storage_data) for rank in results for result in rank]
            if not all(isinstance(item, StoredItem) for _, item in stored):
                raise JobConfigurationError("a rank's write results were not made by Writer")
            commits: dict[str, NodeCommit] = {item.commit.node: item.commit for _, item in stored}
            document = encode_metadata(metadata, stored)
            meta = write_node(
                self.location,
                METADATA_NODE,
                self.epoch,
                {METADATA_BLOB: np.frombuffer(document, dtype=np.uint8)},
            )
            commit_epoch(self.location, self.epoch, [*commits.values(), meta])
            release_intents_of(self.storage, (item for _, item in stored))
        except BaseException:
            self._release()
            raise
        lease, self._lease = self._lease, None
        if lease is not None:  # committed: the save is done; the lease goes meanwhile
            kept_pool(LEASE_THREAD, 1).submit(lease.release)

    def _release(self) -> None:
        lease, self._lease = self._lease, None
        if lease is not None:
            lease.release()

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return False  # never picked by DCP from a checkpoint_id: pass a Writer

    def storage_meta(self) -> StorageMeta | None:
        return None


class Reader(StorageReader):
    """DCP's storage reader of one committed epoch under ``root``: ``epoch``, or the
    newest one whose save completed.

    The epoch and its metadata are found and checked when the reader is made: raises
    :class:`~ckptstore.errors.CheckpointNotFoundError` if there is no such committed
    epoch and :class:`~ckptstore.errors.CorruptCheckpointError` if its metadata is
    damaged (without ``epoch``, an older intact epoch is taken instead, with a warning).
    ``allow_pickle=True`` lets DCP's planner unpickle non-tensor entries that
    ``torch.load(weights_only=True)`` refuses (only for checkpoints you trust).

    Example::

        >>> Reader("./nothing-here")
        Traceback (most recent call last):
        ckptstore.errors.CheckpointNotFoundError: no committed DCP checkpoint under ...
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        epoch: int | None = None,
        storage_options: Mapping[str, object] | None = None,
        *,
        allow_pickle: bool = False,
    ) -> None:
        super().__init__()
        self.location = _open(root, storage_options, None)
        self.storage = self.location.storage
        self.allow_pickle = allow_pickle
        self.bytes_read = 0
        """Bytes of stored pieces this reader read (each checked against its CRC)."""
        self._manifests: dict[str, NodeManifest] = {}
        with paused_gc():  # decoding makes tens of thousands of small objects
            if epoch is None:
                self.epoch, self._decoded = self._newest()
            else:
                self.epoch = _epoch(epoch)
                if not committed_nodes(self.location, self.epoch, [METADATA_NODE]):
                    raise self._not_found(f"epoch {self.epoch} is not committed")
                self._decoded = self._read_metadata(self.epoch)

    def _not_found(self, detail: str) -> CheckpointNotFoundError:
        url = self.storage.display_url
        return CheckpointNotFoundError(
            url,
            METADATA_NODE,
            None,
            f"no committed DCP checkpoint under {url} ({detail}); save one with "
            f"dcp.save(state, storage_writer=Writer(root, epoch=...)), or `ckptstore ls {url}` "
            "to see what is there",
        )

    def _newest(self) -> tuple[int, DecodedMetadata]:
        listing = CommitListing.of(self.location)
        before: int | None = None
        while (epoch := listing.newest_complete([METADATA_NODE], before=before)) is not None:
            try:
                return epoch, self._read_metadata(epoch)
            except CorruptCheckpointError as error:
                log.warning("Skipping DCP epoch %d, whose metadata is damaged: %s", epoch, error)
                before = epoch
        raise self._not_found("no epoch of it is committed")

    def _read_metadata(self, epoch: int) -> DecodedMetadata:
        manifest = open_node(self.location, METADATA_NODE, epoch)
        url = self.location.db_path(METADATA_NODE, epoch)
        reader = self.location.reader_for(manifest)
        raw = metadata_bytes(self.storage, manifest, reader, self.location.engine(), url=url)
        return decode_metadata(raw, url=url, key=METADATA_BLOB)

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        _no_checkpoint_id(checkpoint_id, "Reader")

    def read_metadata(self, *args: object, **kwargs: object) -> Metadata:
        return self._decoded.metadata

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: object, **kwargs: object
    ) -> None:
        pass

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return False  # never picked by DCP from a checkpoint_id: pass a Reader

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Read every item of ``plan``: for a tensor, only the stored pieces holding the
        part asked for, each checked against its CRC, read straight into the planner's
        tensor when it asks for a whole saved chunk, else copied into it from them; a
        byte entry whole, checked, then handed to the planner (:mod:`._dcp_load`). The
        items of every node are read in one pass, in stored order, with the cyclic
        garbage collector paused (the plan's bookkeeping is thousands of short-lived
        objects: docs/design.md, "DCP checkpoints")."""
        with paused_gc():
            by_node: dict[str, list[tuple[ReadItem, str]]] = {}
            for item in plan.items:
                node, blob = self._decoded.items[item_key(item.storage_index)]
                by_node.setdefault(node, []).append((item, blob))
            self._open_manifests(list(by_node))
            fast: list[Wanted] = []
            others: list[Wanted] = []
            for node, wanted in by_node.items():
                manifest, plain_items, rest = self._sorted_out(node, wanted)
                fast.append((manifest, plain_items))
                others.append((manifest, rest))
            self._read_plain(fast, planner)
            for manifest, rest in others:
                self._read_others(manifest, rest, planner)
        return _done(None)

    def _sorted_out(
        self, node: str, wanted: list[tuple[ReadItem, str]]
    ) -> tuple[NodeManifest, list[tuple[ReadItem, str]], list[tuple[ReadItem, str]]]:
        """``node``'s manifest; its items read here (plain stored pieces: records
        checked, in stored order) and the others."""
        manifest = self._manifest(node)
        for _, blob in wanted:
            if blob not in manifest.blobs:
                raise CorruptCheckpointError(
                    f"the metadata names blob {blob!r}, which the node lacks",
                    url=self.storage.display_url,
                    node=node,
                    epoch=self.epoch,
                )
        fast: list[tuple[ReadItem, str]] = []
        rest: list[tuple[ReadItem, str]] = []
        for pair in wanted:
            (fast if plain(manifest, manifest.blobs[pair[1]]) else rest).append(pair)
        if fast:
            records = list({blob: manifest.blobs[blob] for _, blob in fast}.values())
            reader = self.location.reader_for(manifest)
            check_records(self.storage, manifest, records, reader)
            fast.sort(key=lambda pair: _stored_at(manifest.blobs[pair[1]]))
        return manifest, fast, rest

    def _read_others(
        self, manifest: NodeManifest, wanted: list[tuple[ReadItem, str]], planner: LoadPlanner
    ) -> None:
        """Read items of other records through ``read_blobs``, each blob once a round."""
        rounds: list[dict[str, tuple[ReadItem, Partial | None]]] = [{}]
        for item, blob in wanted:
            if blob in rounds[-1]:
                rounds.append({})
            rounds[-1][blob] = (item, self._partial(item, manifest, blob))
        for batch in rounds:
            if batch:
                self._read_batch(manifest, batch, planner)

    def _read_plain(self, nodes: list[Wanted], planner: LoadPlanner) -> None:
        """Read items whose blobs are plain stored pieces (:func:`._dcp_load.plain`),
        of every node at once, in waves through the engine; hand each wave to the
        planner once its pieces are checked."""
        wants = (
            (manifest, self._want(item, manifest, blob, planner))
            for manifest, wanted in nodes
            for item, blob in wanted
        )
        engine = engine_for(self.location.engine(), sum(1 for _, wanted in nodes if wanted))
        for wave in read_in_waves(self.storage, engine, wants):
            self.bytes_read += sum(want.data.nbytes for _, want in wave)
            for manifest, want in wave:
                if want.tensor is None:
                    blob = want.record.name
                    self._load_bytes(want.item, planner, want.data, manifest.node, blob)
                elif want.in_place:
                    planner.commit_tensor(want.item, want.tensor)
                else:
                    partial = Partial(want.record, want.first, want.start)
                    self._copy_box(want.item, planner, want.tensor, want.data, partial)

    def _want(
        self, item: ReadItem, manifest: NodeManifest, blob: str, planner: LoadPlanner
    ) -> Want:
        fqn = item.storage_index.fqn
        record = manifest.blobs[blob]
        partial = self._partial(item, manifest, blob, whole=True)
        if partial is None:
            size = sum(chunk.size for chunk in record.chunks)
            return Want(item, f"entry {fqn!r}", record, 0, 0, np.empty(size, np.uint8))
        tensor = self._target(item, planner)
        size = sum(chunk.size for chunk in partial.record.chunks)
        entry = self._entry(item)
        assert isinstance(entry, TensorStorageMetadata)
        whole = partial.record is record  # the item is the whole saved chunk
        own = bytes_of(tensor, entry.properties.dtype, size) if whole else None
        data = np.empty(size, np.uint8) if own is None else own
        name = f"tensor {fqn!r}"
        in_place = own is not None
        return Want(
            item, name, partial.record, partial.first, partial.start, data, tensor, in_place
        )

    def _open_manifests(self, nodes: list[str]) -> None:
        """Open the manifests of ``nodes`` not yet open, at once (each is a few reads)."""
        missing = [node for node in nodes if node not in self._manifests]
        if len(missing) > 1:
            list(kept_pool("ckptstore-dcp-manifests", 8).map(self._manifest, missing))

    def _manifest(self, node: str) -> NodeManifest:
        manifest = self._manifests.get(node)
        if manifest is None:
            manifest, _, commit = open_node_record(self.location, node, self.epoch)
            if commit.manifest_crc32c != self._decoded.nodes.get(node):
                raise CorruptCheckpointError(
                    "the node's committed manifest is not the one the DCP metadata names",
                    url=self.storage.display_url,
                    node=node,
                    epoch=self.epoch,
                )
            self._manifests[node] = manifest
        return manifest

    def _entry(self, item: ReadItem) -> TensorStorageMetadata | BytesStorageMetadata:
        return self._decoded.metadata.state_dict_metadata[item.storage_index.fqn]

    def _partial(
        self, item: ReadItem, manifest: NodeManifest, blob: str, *, whole: bool = False
    ) -> Partial | None:
        """The pieces of ``blob`` holding ``item``'s box, as bytes (None for a byte
        entry); with ``whole``, the stored record itself if the box is the whole chunk."""
        entry = self._entry(item)
        if item.type == LoadItemType.BYTE_IO or not isinstance(entry, TensorStorageMetadata):
            return None
        record = manifest.blobs[blob]
        shape = self._chunk_shape(item, entry)
        itemsize = entry.properties.dtype.itemsize
        if record.shape != tuple(shape) or record.numpy_dtype().itemsize != itemsize:
            raise CorruptCheckpointError(
                f"blob {blob!r} is {record.shape} of {record.dtype}, not the saved chunk "
                f"{tuple(shape)} of {entry.properties.dtype} the DCP metadata names",
                url=self.storage.display_url,
                node=manifest.node,
                epoch=self.epoch,
            )
        if 0 in item.lengths:
            return covering(record, itemsize, shape, [0] * len(shape), [1] * len(shape))
        if whole and list(item.lengths) == shape and not any(item.storage_offsets):
            return Partial(record, 0, 0)
        return covering(record, itemsize, shape, item.storage_offsets, item.lengths)

    def _chunk_shape(self, item: ReadItem, entry: TensorStorageMetadata) -> list[int]:
        offsets = item_key(item.storage_index)[1]
        for chunk in entry.chunks:
            if tuple(chunk.offsets) == offsets:
                if any(
                    o + n > s
                    for o, n, s in zip(item.storage_offsets, item.lengths, chunk.sizes, strict=True)
                ):
                    break
                return list(chunk.sizes)
        raise CorruptCheckpointError(
            f"the load asks for a part of {item.storage_index.fqn!r} that no saved chunk holds",
            url=self.storage.display_url,
            epoch=self.epoch,
        )

    def _read_batch(
        self,
        manifest: NodeManifest,
        batch: Mapping[str, tuple[ReadItem, Partial | None]],
        planner: LoadPlanner,
    ) -> None:
        records = {
            blob: manifest.blobs[blob] if partial is None else partial.record
            for blob, (_, partial) in batch.items()
        }
        partial_manifest = replace(manifest, blobs=records)  # its files: the same attempt
        try:
            arrays = read_blobs(self.location, partial_manifest, list(records))
        except CorruptCheckpointError as error:
            if error.blob is None or error.blob not in batch:
                raise
            item, partial = batch[error.blob]
            raise in_tensor(error, item.storage_index.fqn, partial) from None
        self.bytes_read += sum(record.stored_bytes for record in records.values())
        for blob, (item, partial) in batch.items():
            data = arrays[blob]
            if partial is None:
                self._load_bytes(item, planner, data, manifest.node, blob)
            else:
                self._load_tensor(item, planner, data, partial)

    def _load_bytes(
        self, item: ReadItem, planner: LoadPlanner, data: np.ndarray[Any, Any], node: str, blob: str
    ) -> None:
        value = data.tobytes()
        if not self.allow_pickle:
            try:
                torch.load(io.BytesIO(value), weights_only=True)
            except Exception as error:
                raise UnsupportedBlobError(
                    item.storage_index.fqn,
                    f"the stored entry (node {node!r}, blob {blob!r}) holds objects "
                    f"torch.load(weights_only=True) refuses ({type(error).__name__}); if you "
                    "trust this checkpoint, load it with Reader(..., allow_pickle=True)",
                ) from None
        planner.load_bytes(item, io.BytesIO(value))

    def _load_tensor(
        self, item: ReadItem, planner: LoadPlanner, data: np.ndarray[Any, Any], partial: Partial
    ) -> None:
        self._copy_box(item, planner, self._target(item, planner), data, partial)

    def _target(self, item: ReadItem, planner: LoadPlanner) -> torch.Tensor:
        """The planner's tensor for ``item``, checked to be the size it asked for."""
        target = planner.resolve_tensor(item).detach()
        if tuple(target.size()) != tuple(item.lengths):
            raise JobConfigurationError(
                f"the planner's tensor for {item.dest_index.fqn!r} is {tuple(target.size())}, "
                f"not the {tuple(item.lengths)} it asked for"
            )
        return target

    def _copy_box(
        self,
        item: ReadItem,
        planner: LoadPlanner,
        target: torch.Tensor,
        data: np.ndarray[Any, Any],
        partial: Partial,
    ) -> None:
        """Copy ``item``'s box from ``data`` (the bytes of ``partial``) into ``target``."""
        entry = self._entry(item)
        assert isinstance(entry, TensorStorageMetadata)
        if target.numel():
            shape = self._chunk_shape(item, entry)
            try:
                box = box_of(
                    data, partial, entry.properties.dtype, shape, item.storage_offsets, item.lengths
                )
            except ValueError as error:  # a manifest whose pieces do not add up to the blob
                raise CorruptCheckpointError(
                    f"{error} (tensor {item.storage_index.fqn!r})",
                    url=self.storage.display_url,
                    blob=partial.record.name,
                    epoch=self.epoch,
                ) from None
            target.copy_(box)
        planner.commit_tensor(item, target)
