"""The commit protocol: how a node checkpoint is written, published and committed, how
readers find committed epochs, how a committed checkpoint is copied with verification.

Owns the truth of what exists in storage (commit records, manifests). May import
:mod:`ckptstore.plugin` (the contracts it drives), :mod:`ckptstore.execution`
(workspaces' blobs), :mod:`ckptstore.records`, :mod:`ckptstore.io` and
:mod:`ckptstore.errors`; never the managers, the built-ins or the tools above it.

Example::

    >>> from ckptstore.protocol import commit_epoch, open_node, write_node
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

from ckptstore.protocol._archives import check_archives, refuse_unsafe_archives
from ckptstore.protocol._bounds import check_decodable, corrupt_in_node
from ckptstore.protocol._chunks import (
    INTENT_KIND,
    INTENTS_DIR,
    ChunkStore,
    Collection,
    collect_chunks,
    shared_chunk_keys,
)
from ckptstore.protocol._commit import (
    EpochCommit,
    NodeCommit,
    check_can_hold,
    check_not_committed,
    commit_epoch,
    committed_nodes,
    open_node,
    open_node_record,
    publish_node,
    read_blobs,
    read_commit,
    read_commit_under,
    read_listed_commit,
    require_commit,
    retract_epoch,
    verify_node,
    write_node,
)
from ckptstore.protocol._control import control_keys
from ckptstore.protocol._garbage import collect_garbage, find_garbage
from ckptstore.protocol._incremental import check_frozen, check_incremental
from ckptstore.protocol._inventory import (
    EpochEntry,
    NodeEntry,
    RunEntry,
    committed_epochs,
    committed_epochs_in,
    scan,
)
from ckptstore.protocol._lease import DEFAULT_LEASE_TTL, WriterLease, check_lease_ttl
from ckptstore.protocol._lease_document import (
    LeaseFence,
    LeaseHolder,
    break_lease,
    fenced_out,
    read_lease,
    read_lease_document,
)
from ckptstore.protocol._listing import CommitListing, newest_complete
from ckptstore.protocol._location import CheckpointLocation, storage_of
from ckptstore.protocol._transfer import copy_node, copy_node_task

__all__ = [
    "DEFAULT_LEASE_TTL",
    "INTENTS_DIR",
    "INTENT_KIND",
    "CheckpointLocation",
    "ChunkStore",
    "Collection",
    "CommitListing",
    "EpochCommit",
    "EpochEntry",
    "LeaseFence",
    "LeaseHolder",
    "NodeCommit",
    "NodeEntry",
    "RunEntry",
    "WriterLease",
    "break_lease",
    "check_archives",
    "check_can_hold",
    "check_decodable",
    "check_frozen",
    "check_incremental",
    "check_lease_ttl",
    "check_not_committed",
    "collect_chunks",
    "collect_garbage",
    "commit_epoch",
    "committed_epochs",
    "committed_epochs_in",
    "committed_nodes",
    "control_keys",
    "copy_node",
    "copy_node_task",
    "corrupt_in_node",
    "fenced_out",
    "find_garbage",
    "newest_complete",
    "open_node",
    "open_node_record",
    "publish_node",
    "read_blobs",
    "read_commit",
    "read_commit_under",
    "read_lease",
    "read_lease_document",
    "read_listed_commit",
    "refuse_unsafe_archives",
    "require_commit",
    "retract_epoch",
    "scan",
    "shared_chunk_keys",
    "storage_of",
    "verify_node",
    "write_node",
]
