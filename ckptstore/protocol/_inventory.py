"""What is stored under a URL: runs (checkpoint roots), their epochs and node
checkpoints, committed or not, with sizes. :func:`scan` lists the whole storage: it is
for the operator tools (``ckptstore ls``, ``gc``), never on the save or resume path.
:func:`committed_epochs` lists only the control directory: resume (when it chooses the
epoch) and retention (once per pass) call it.

A run is a prefix holding ckptstore's layout (see :mod:`ckptstore.records._layout`). An epoch is
``committed`` when its commit record lists every node checkpoint found for it,
``partial`` when some node checkpoints of it are not in the record, ``uncommitted``
without a record. A node checkpoint is ``committed``, ``uncommitted`` (written, not
committed) or ``writing`` (no manifest yet, or a staging directory of an earlier
version: a save in progress or interrupted). A committed node names the attempt its
record commits (``<node>.<epoch>/attempt-<id>/``, where its files are).

Example::

    >>> from ckptstore import CheckpointManager, LocalSession
    >>> from ckptstore.builtin import LocalPath
    >>> session = LocalSession()
    >>> session.workspace("trainer_0")["w"] = np.ones(2)
    >>> manager = CheckpointManager("runs/a", "trainer_0", "npz")
    >>> _ = session.run(manager.init(["trainer_0"]))
    >>> _ = session.run(manager.save(3))
    >>> for run in scan(LocalPath("runs")):  # or get_registry().open_path("s3://bucket/runs")
    ...     for epoch in run.epochs:
    ...         print(run.prefix, epoch.epoch, epoch.state, epoch.stored_bytes > 0)
    a 3 committed True
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from ckptstore._types import JSONObject
from ckptstore.errors import CorruptCheckpointError, ObjectNotFoundError
from ckptstore.execution import DEFAULT_NODE
from ckptstore.plugin import PathType
from ckptstore.protocol import _commit as protocol
from ckptstore.protocol._control import control_keys
from ckptstore.protocol._location import CheckpointLocation, storage_of
from ckptstore.records import (
    CONTROL_DIR,
    MANIFEST_NAME,
    RETIRED_MARK,
    STAGING_MARK,
    NodeManifest,
    join_url,
    manifest_key,
    node_data_key,
    parse_attempt_dir,
    parse_commit_record_key,
    parse_db_key,
    parse_node_commit_key,
)

__all__ = [
    "EpochEntry",
    "NodeEntry",
    "RunEntry",
    "committed_epochs",
    "committed_epochs_in",
    "scan",
]


@dataclass(frozen=True)
class NodeEntry:
    """One node checkpoint found under a run.

    Example::

        >>> NodeEntry("trainer_0", 3, "committed", "npz", nbytes=4096, stored_bytes=4400).state
        'committed'
    """

    node: str
    epoch: int
    state: str
    db_type: str | None = None
    nbytes: int | None = None
    stored_bytes: int | None = None
    nblobs: int | None = None
    shared_bytes: int = 0
    """Of ``stored_bytes``, those in the root's chunk store (incremental saves)."""
    attempt: str | None = None
    """The committed attempt (``None``: uncommitted, or an earlier version's layout)."""

    @property
    def data_key(self) -> str:
        """Where the node checkpoint's files are, relative to the run's root."""
        return node_data_key(self.node, self.epoch, self.attempt)

    @property
    def default_node(self) -> bool:
        """Whether this is the default node (``"local"``): the node of the tasks
        created outside any ``with Node(...)``, such as ``epoch_limiter``'s counter."""
        return self.node == DEFAULT_NODE

    def to_json(self) -> JSONObject:
        return {
            "node": self.node,
            "default_node": self.default_node,
            "state": self.state,
            "db_type": self.db_type,
            "nbytes": self.nbytes,
            "stored_bytes": self.stored_bytes,
            "shared_bytes": self.shared_bytes,
            "nblobs": self.nblobs,
            "attempt": self.attempt,
            "data_key": self.data_key if self.state == "committed" else None,
        }


@dataclass(frozen=True)
class EpochEntry:
    """One epoch of a run and its node checkpoints.

    Example::

        >>> from ckptstore import CheckpointManager, LocalSession
        >>> from ckptstore.builtin import LocalPath
        >>> session = LocalSession()
        >>> session.workspace("trainer_0")["w"] = np.ones(2)
        >>> manager = CheckpointManager("jobs/a", "trainer_0", "npz")
        >>> _ = session.run(manager.init(["trainer_0"]))
        >>> _ = session.run(manager.save(3))
        >>> entry = scan(LocalPath("jobs"))[0].epochs[0]
        >>> entry.state, entry.stored_bytes > 0, [node.node for node in entry.nodes]
        ('committed', True, ['trainer_0'])
    """

    epoch: int
    state: str
    nodes: tuple[NodeEntry, ...]
    committed_at: str | None = None

    @property
    def nbytes(self) -> int:
        return sum(node.nbytes or 0 for node in self.nodes)

    @property
    def stored_bytes(self) -> int:
        return sum(node.stored_bytes or 0 for node in self.nodes)

    @property
    def shared_bytes(self) -> int:
        """Of :attr:`stored_bytes`, those in the root's chunk store."""
        return sum(node.shared_bytes for node in self.nodes)

    def to_json(self) -> JSONObject:
        return {
            "epoch": self.epoch,
            "state": self.state,
            "committed_at": self.committed_at,
            "nbytes": self.nbytes,
            "stored_bytes": self.stored_bytes,
            "shared_bytes": self.shared_bytes,
            "nodes": [node.to_json() for node in self.nodes],
        }


@dataclass(frozen=True)
class RunEntry:
    """One checkpoint root: ``prefix`` relative to the scanned URL (``""``: the URL).

    Example::

        >>> from ckptstore import CheckpointManager, LocalSession
        >>> from ckptstore.builtin import LocalPath
        >>> session = LocalSession()
        >>> session.workspace("trainer_0")["w"] = np.ones(2)
        >>> manager = CheckpointManager("sweep/a", "trainer_0", "npz")
        >>> _ = session.run(manager.init(["trainer_0"]))
        >>> _ = session.run(manager.save(3))
        >>> [run.prefix for run in scan(LocalPath("sweep"))]
        ['a']
    """

    prefix: str
    url: str
    epochs: tuple[EpochEntry, ...] = field(default=())

    def to_json(self) -> JSONObject:
        return {
            "prefix": self.prefix,
            "url": self.url,
            "stored_bytes": sum(epoch.stored_bytes for epoch in self.epochs),
            "epochs": [epoch.to_json() for epoch in self.epochs],
        }


def committed_epochs(where: CheckpointLocation | PathType, prefix: str = "") -> list[int]:
    """The epochs with a commit record under ``prefix``, ascending (lists the control
    directory only: one LIST, what resume and retention afford once per call)."""
    return committed_epochs_in(control_keys(where, prefix), prefix)


def committed_epochs_in(keys: Iterable[str], prefix: str = "") -> list[int]:
    """The epochs with a commit record among ``keys`` listed under ``prefix``'s control
    directory, ascending (for callers that list it once for several purposes)."""
    epochs = set()
    for key in keys:
        epoch = parse_commit_record_key(key[len(prefix) + 1 :] if prefix else key)
        if epoch is not None:
            epochs.add(epoch)
    return sorted(epochs)


@dataclass
class _Found:
    manifests: dict[tuple[str, int], set[str | None]] = field(
        default_factory=lambda: defaultdict(set)
    )
    writing: dict[tuple[str, int], list[str]] = field(default_factory=lambda: defaultdict(list))
    epochs: set[int] = field(default_factory=set)


def scan(where: CheckpointLocation | PathType) -> list[RunEntry]:
    """Every run under ``where``'s root, sorted by prefix."""
    storage = storage_of(where)
    keys = storage.list_keys()
    runs = _run_prefixes(keys)
    found: dict[str, _Found] = {prefix: _Found() for prefix in runs}
    for key in keys:
        prefix = _owning_run(key, runs)
        if prefix is None:
            continue
        _classify(key[len(prefix) + 1 :] if prefix else key, key, found[prefix])
    return [_run_entry(storage, prefix, found[prefix]) for prefix in sorted(runs)]


def _run_prefixes(keys: Iterable[str]) -> set[str]:
    """Prefixes holding a commit record, a node manifest or a staging directory."""
    runs = set()
    for key in keys:
        parts = key.split("/")
        if (
            len(parts) >= 3
            and parts[-1] == MANIFEST_NAME
            and parse_attempt_dir(parts[-2]) is not None
            and parse_db_key(parts[-3]) is not None
        ):
            runs.add("/".join(parts[:-3]))
        elif len(parts) >= 2 and _marks_a_run(parts[-2], parts[-1]):
            runs.add("/".join(parts[:-2]))
        elif len(parts) >= 3 and parse_node_commit_key("/".join(parts[-3:])) is not None:
            runs.add("/".join(parts[:-3]))
    return runs


def _marks_a_run(directory: str, name: str) -> bool:
    if directory == CONTROL_DIR:
        return parse_commit_record_key(f"{CONTROL_DIR}/{name}") is not None
    if name == MANIFEST_NAME:
        return parse_db_key(directory) is not None
    return directory.startswith(".") and STAGING_MARK in directory


def _owning_run(key: str, runs: set[str]) -> str | None:
    """The longest run prefix ``key`` lies under."""
    parts = key.split("/")
    for cut in range(len(parts) - 1, -1, -1):
        prefix = "/".join(parts[:cut])
        if prefix in runs:
            return prefix
    return None


def _classify(relative: str, key: str, found: _Found) -> None:
    head, _, rest = relative.partition("/")
    if not rest:
        return
    if head == CONTROL_DIR:
        epoch = parse_commit_record_key(relative)
        if epoch is not None:
            found.epochs.add(epoch)
        return
    if head.startswith(".") and STAGING_MARK in head:
        parsed = parse_db_key(head[1:].split(STAGING_MARK, 1)[0])
        if parsed is not None:
            found.writing[parsed].append(key)
        return
    if RETIRED_MARK in head:
        return
    parsed = parse_db_key(head)
    if parsed is None:
        return
    directory, _, inside = rest.partition("/")
    attempt = parse_attempt_dir(directory) if inside else None
    if (inside if attempt is not None else rest) == MANIFEST_NAME:
        found.manifests[parsed].add(attempt)
    else:
        found.writing[parsed].append(key)


def _run_entry(storage: PathType, prefix: str, found: _Found) -> RunEntry:
    records = {epoch: _read_commit(storage, prefix, epoch) for epoch in found.epochs}
    nodes: dict[int, dict[str, NodeEntry]] = defaultdict(dict)
    for epoch, record in records.items():
        for name, commit in (record.nodes if record else {}).items():
            nodes[epoch][name] = NodeEntry(
                name,
                epoch,
                "committed",
                commit.db_type,
                commit.nbytes,
                commit.stored_bytes,
                commit.nblobs,
                commit.shared_bytes,
                commit.attempt,
            )
    for (node, epoch), attempts in sorted(found.manifests.items()):
        if node not in nodes[epoch]:
            attempt = sorted(attempts, key=lambda found: found or "")[0]
            nodes[epoch][node] = _uncommitted(storage, prefix, node, epoch, attempt)
    for (node, epoch), keys in sorted(found.writing.items()):
        if node not in nodes[epoch]:
            size = sum(_size(storage, key) for key in keys)
            nodes[epoch][node] = NodeEntry(node, epoch, "writing", stored_bytes=size)
    epochs = []
    for epoch in sorted(nodes):
        record = records.get(epoch)
        entries = tuple(entry for _, entry in sorted(nodes[epoch].items()))
        if record is None:
            state = "uncommitted"
        elif all(entry.state == "committed" for entry in entries):
            state = "committed"
        else:
            state = "partial"
        epochs.append(EpochEntry(epoch, state, entries, record.committed_at if record else None))
    url = join_url(storage.display_url, prefix) if prefix else storage.display_url
    return RunEntry(prefix, url, tuple(epochs))


def _read_commit(storage: PathType, prefix: str, epoch: int) -> protocol.EpochCommit | None:
    try:
        return protocol.read_commit_under(storage, prefix, epoch)
    except CorruptCheckpointError:
        return None


def _join(prefix: str, key: str) -> str:
    return f"{prefix}/{key}" if prefix else key


def _uncommitted(
    storage: PathType, prefix: str, node: str, epoch: int, attempt: str | None
) -> NodeEntry:
    """An uncommitted node checkpoint, sized from one of its attempts' manifests."""
    key = _join(prefix, manifest_key(node_data_key(node, epoch, attempt)))
    try:
        data = storage.read_document(key)
        manifest = NodeManifest.decode(data, url=storage.display_url, key=key)
    except (CorruptCheckpointError, ObjectNotFoundError):
        return NodeEntry(node, epoch, "uncommitted")
    return NodeEntry(
        node,
        epoch,
        "uncommitted",
        manifest.db_type,
        manifest.nbytes,
        manifest.stored_bytes + len(data),
        len(manifest.blobs),
    )


def _size(storage: PathType, key: str) -> int:
    try:
        return storage.size(key)
    except ObjectNotFoundError:
        return 0  # removed since it was listed (a save finishing or cleaning up)
