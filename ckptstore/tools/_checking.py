"""Looking inside committed checkpoints: what an epoch holds, and whether every stored
byte still matches its checksum. Used by ``ckptstore inspect`` and ``ckptstore verify``.

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
    >>> description = describe_epoch(storage, 3)
    >>> [node["node"] for node in description["nodes"]]
    ['trainer_0']
    >>> [check.problems for check in verify_epochs(storage, [3])]
    [()]
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import TypedDict

from ckptstore import protocol
from ckptstore._types import JSONObject
from ckptstore.errors import CorruptCheckpointError
from ckptstore.execution import DEFAULT_NODE
from ckptstore.io import ByteProgress, NodeProgress, ParallelIO, is_shared_key
from ckptstore.plugin import PathType, get_registry
from ckptstore.protocol import check_archives
from ckptstore.records import MANIFEST_NAME, NodeManifest, get_ckpt_filename

__all__ = [
    "BlobDescription",
    "EpochDescription",
    "NodeCheck",
    "NodeDescription",
    "describe_epoch",
    "verify_epochs",
]


class BlobDescription(TypedDict):
    """One blob of a node checkpoint, as :func:`describe_epoch` reports it."""

    name: str
    dtype: str
    shape: list[int]
    nbytes: int
    stored_bytes: int
    chunks: int
    codec: str


class NodeDescription(TypedDict):
    """One node's checkpoint of an epoch, as :func:`describe_epoch` reports it."""

    node: str
    default_node: bool
    """Whether ``node`` is the default node (``"local"``), which runs the tasks created
    outside any ``with Node(...)``, such as ``epoch_limiter``'s counter."""
    db_type: str
    data_key: str
    """Where the node's files are, relative to the URL: its committed attempt's
    directory (``<node>.<epoch>/attempt-<id>``, or ``<node>.<epoch>`` for a checkpoint
    an earlier version wrote)."""
    nbytes: int
    stored_bytes: int
    shared_bytes: int
    """Of ``stored_bytes``, those in the root's chunk store (incremental saves): the
    chunks the node refers to there, which other epochs and nodes may share."""
    created: str
    blobs: list[BlobDescription]


class EpochDescription(TypedDict):
    """A committed epoch, as :func:`describe_epoch` reports it."""

    url: str
    epoch: int
    committed_at: str
    nbytes: int
    stored_bytes: int
    nodes: list[NodeDescription]


def describe_epoch(
    storage: PathType, epoch: int, nodes: Iterable[str] | None = None
) -> EpochDescription:
    """A JSON-ready description of a committed epoch: its nodes, and each node's blobs
    with dtype, shape, bytes and chunk count."""
    record = protocol.require_commit(storage, epoch)
    wanted = sorted(record.nodes) if nodes is None else list(nodes)
    described = []
    for node in wanted:
        manifest = protocol.open_node(storage, node, epoch)
        described.append(_describe_node(manifest, record.nodes[node]))
    return {
        "url": storage.display_url,
        "epoch": epoch,
        "committed_at": record.committed_at,
        "nbytes": sum(node["nbytes"] for node in described),
        "stored_bytes": sum(node["stored_bytes"] for node in described),
        "nodes": described,
    }


def _describe_node(manifest: NodeManifest, commit: protocol.NodeCommit) -> NodeDescription:
    return {
        "node": manifest.node,
        "default_node": manifest.node == DEFAULT_NODE,
        "db_type": manifest.db_type,
        "data_key": commit.data_key,
        "nbytes": manifest.nbytes,
        "stored_bytes": commit.stored_bytes,
        "shared_bytes": sum(
            chunk.stored
            for record in manifest.blobs.values()
            for chunk in record.chunks
            if is_shared_key(chunk.key)
        ),
        "created": manifest.created,
        "blobs": [
            {
                "name": name,
                "dtype": record.dtype,
                "shape": list(record.shape),
                "nbytes": record.nbytes,
                "stored_bytes": record.stored_bytes,
                "chunks": len(record.chunks),
                "codec": record.codec,
            }
            for name, record in sorted(manifest.blobs.items())
        ],
    }


@dataclass(frozen=True)
class NodeCheck:
    """The outcome of verifying one node checkpoint.

    Example::

        >>> from ckptstore import CheckpointManager, LocalSession
        >>> from ckptstore.builtin import LocalPath
        >>> session = LocalSession()
        >>> session.workspace("trainer_0")["w"] = np.ones(2)
        >>> manager = CheckpointManager("verified", "trainer_0", "npz")
        >>> _ = session.run(manager.init(["trainer_0"]))
        >>> for epoch in (3, 4):
        ...     _ = session.run(manager.save(epoch))
        >>> storage = LocalPath("verified")
        >>> checks = verify_epochs(storage, [3, 4])
        >>> [problem.blob for check in checks if not check.ok for problem in check.problems]
        []
    """

    node: str
    epoch: int
    stored_bytes: int
    problems: tuple[CorruptCheckpointError, ...]
    committed: bool = True
    """False for a node checkpoint stored for the epoch but missing from its commit
    record (``ckptstore ls`` calls such an epoch ``partial``): nothing of it is read."""

    @property
    def ok(self) -> bool:
        return not self.problems and self.committed

    def to_json(self) -> JSONObject:
        return {
            "node": self.node,
            "epoch": self.epoch,
            "ok": self.ok,
            "committed": self.committed,
            "stored_bytes": self.stored_bytes,
            "problems": [
                {"blob": p.blob, "chunk": p.chunk, "file": p.file, "message": str(p)}
                for p in self.problems
            ],
        }


def verify_epochs(
    storage: PathType,
    epochs: Iterable[int],
    *,
    on_checked: Callable[[NodeCheck], None] | None = None,
    on_bytes: ByteProgress | None = None,
    deep: bool = False,
) -> list[NodeCheck]:
    """Re-read every byte of every node checkpoint of ``epochs`` and check its checksum;
    one :class:`NodeCheck` per node, problems listed rather than raised. ``on_bytes``
    hears bytes as chunks are checked, each node's stored bytes in all.

    A node that committed some epoch but not one of ``epochs``, while its checkpoint of
    that epoch is stored (a lost or never written commit record: the epoch is
    ``partial``), gets a check with ``committed=False``: the epoch is not whole.

    With ``deep``, every packed archive (``blobs.zarr.zip``, ``blobs.npz``) is also
    checked to be a ZIP that other readers may open safely
    (:func:`~ckptstore.protocol._archives.check_archives`: names, offsets, sizes,
    compression ratios), which ``cp`` and ``convert`` require too."""
    settings = storage.default_io.with_environment()
    job_nodes = frozenset().union(*protocol.CommitListing.of(storage).nodes.values())
    checks = []
    for epoch in epochs:
        record = protocol.require_commit(storage, epoch)
        found = [
            NodeCheck(node, epoch, commit.stored_bytes, ()) for node, commit in record.nodes.items()
        ]
        found.extend(
            NodeCheck(node, epoch, 0, (), committed=False)
            for node in job_nodes - set(record.nodes)
            if _written(storage, node, epoch)
        )
        for check in sorted(found, key=lambda check: check.node):
            progress = NodeProgress(on_bytes, check.stored_bytes)
            if check.committed:
                db_type = get_registry().db_type(record.nodes[check.node].db_type)
                engine = ParallelIO(settings, progress=progress)
                try:
                    manifest = protocol.open_node(storage, check.node, epoch)
                except CorruptCheckpointError as error:
                    problems = [error]
                else:  # opened once, for the bytes' check and the archives'
                    problems = protocol.verify_node(
                        storage, check.node, epoch, db_type, engine, manifest=manifest
                    )
                    if deep and not problems:
                        problems = check_archives(storage, manifest)
                check = replace(check, problems=tuple(problems))
            progress.finish()
            checks.append(check)
            if on_checked is not None:
                on_checked(check)
    return checks


def _written(storage: PathType, node: str, epoch: int) -> bool:
    """Whether some save of ``node``'s ``epoch`` wrote a manifest (any attempt, or an
    earlier version's layout): one LIST of ``<node>.<epoch>/``."""
    inside = get_ckpt_filename(node, epoch) + "/"
    return any(
        key.startswith(inside) and key.endswith(f"/{MANIFEST_NAME}")
        for key in storage.list_keys(inside[:-1])
    )


def problem_summary(problem: CorruptCheckpointError) -> str:
    """One line naming what is broken (blob, chunk, file)."""
    parts = []
    if problem.blob is not None:
        parts.append(f"blob {problem.blob!r}")
    if problem.chunk is not None:
        parts.append(f"chunk {problem.chunk}")
    if problem.file is not None:
        parts.append(f"file {problem.file}")
    return ", ".join(parts) or "checkpoint"
