"""Saving and loading a tree (nested dicts/lists of arrays and scalars) as one committed
checkpoint, without a Job: ``save_tree(root, epoch, tree)`` / ``load_tree(root)``.

A tree is stored as the node checkpoint ``<root>/<node>.<epoch>`` (node ``"tree"`` by
default) through the same commit protocol as a job's checkpoints: its arrays are blobs
named after their key paths (see :mod:`ckptstore.tree._flatten`), and its structure and
scalars are one small JSON document stored as the blob ``#tree`` (a name no key path can
take), so the manifest's CRC-32C covers it too. ``ckptstore ls/inspect/verify`` work
on it like on any checkpoint. Committed epochs are write-once, as a manager's are:
saving one again raises :class:`~ckptstore.AlreadyCommittedError` unless
``overwrite=True``, which uncommits it first.

Example::

    >>> save_tree("./ckpt", 3, {"w": np.ones(2, np.float32), "step": 3})
    >>> save_tree("./ckpt", 4, {"w": np.zeros(2, np.float32), "step": 4})
    >>> load_tree("./ckpt")  # the newest committed epoch
    {'w': array([0., 0.], dtype=float32), 'step': 4}
    >>> latest_tree_epoch("./ckpt"), load_tree("./ckpt", 3)["step"]
    (4, 3)
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np

from ckptstore.checkpoint import CheckpointManager, ManagerBase, RootLike, first_serving
from ckptstore.errors import (
    CheckpointKindError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    JobConfigurationError,
)
from ckptstore.protocol import (
    CheckpointLocation,
    CommitListing,
    check_can_hold,
    check_not_committed,
    commit_epoch,
    open_node,
    read_blobs,
    write_node,
)
from ckptstore.records import validate_epoch, validate_node_name
from ckptstore.tree._flatten import ArrayAdapter, encode_segment, flatten, unflatten

__all__ = ["SPEC_BLOB", "TreeTarget", "latest_tree_epoch", "load_tree", "save_tree"]

SPEC_BLOB = "#tree"
"""The blob holding a tree's JSON spec."""
MAX_SPEC_BYTES = 64 << 20

TreeTarget = str | CheckpointLocation | ManagerBase | Sequence[RootLike]
"""Where trees go: a local path or URL, an opened location, a manager (its location), or
several roots, fastest first (see :mod:`ckptstore.checkpoint._tiers`)."""


def _location(target: TreeTarget, db_type: str) -> CheckpointLocation:
    if isinstance(target, CheckpointLocation):
        return target
    if isinstance(target, ManagerBase):
        return target.location
    if not isinstance(target, str):
        return _tiered(target, "tree", db_type).location
    return CheckpointLocation.open(str(target), db_type)


def _tiered(roots: Sequence[RootLike], node: str, db_type: str) -> CheckpointManager:
    """A manager of ``node`` over several roots: its tiers copy and read them."""
    return CheckpointManager(list(roots), node, db_type)


def _read_locations(target: TreeTarget, node: str, db_type: str) -> list[CheckpointLocation]:
    """Where a tree is read from, fastest first (one root unless several were given)."""
    if isinstance(target, (str, CheckpointLocation, ManagerBase)):
        return [_location(target, db_type)]
    tiers = _tiered(target, node, db_type).tiers
    return tiers.read_locations() if tiers is not None else [_location(target, db_type)]


def save_tree(
    target: TreeTarget,
    epoch: int,
    tree: object,
    *,
    node: str = "tree",
    db_type: str = "zarr",
    adapter: ArrayAdapter | None = None,
    overwrite: bool = False,
    incremental: bool | None = None,
    frozen: Collection[str | int | tuple[str | int, ...]] = (),
) -> None:
    """Save ``tree`` as ``node``'s checkpoint of ``epoch`` under ``target`` and commit it.

    With several roots (``["/mnt/nvme/run", "s3://bucket/run"]``) it commits on the
    first, then copies the epoch, verified, to each later root and commits it there;
    it returns once every root holds it, or raises
    :class:`~ckptstore.errors.TierCopyFailedError` naming the root that does not.

    ``incremental=True`` stores each chunk of the large arrays once per content under
    the root (unchanged chunks of earlier epochs are referred to, not written again:
    docs/design.md, "Incremental checkpoints"); ``None`` takes the target location's
    (or manager's) setting, off for a path. ``frozen`` (incremental saves of a mapping):
    keys of ``tree``, or paths of keys (``("model", "base.weight")``), whose arrays
    the caller promises hold the bytes they had at this process's previous save of
    ``node``: they are not read again (only one chunk of
    them per save, in turn, is checked). Declare only what nothing writes, such as the
    frozen base of a fine-tuning: a broken promise that the check misses saves the
    previous bytes (docs/design.md, "Incremental checkpoints").

    Committed epochs are write-once: if ``epoch`` is already committed for ``node``,
    :class:`~ckptstore.AlreadyCommittedError` is raised and nothing is written, unless
    ``overwrite`` (then it is uncommitted first, as a manager's ``overwrite=True`` does).
    Raises :class:`~ckptstore.errors.InvalidEpochError` for an epoch that is not a non-negative
    integer, :class:`~ckptstore.errors.UnsupportedBlobError` for a leaf that is not an array or
    an ``int/float/bool/None/str`` (nothing is pickled) and for keys that are not ``str``
    or ``int``; ``db_type`` applies when ``target`` is a path.
    """
    epoch = validate_epoch(epoch)
    validate_node_name(node)
    tiered = None if isinstance(target, (str, CheckpointLocation, ManagerBase)) else target
    manager = _tiered(tiered, node, db_type) if tiered is not None else None
    location = manager.location if manager is not None else _location(target, db_type)
    arrays, spec = flatten(tree, adapter)
    document = json.dumps(spec, separators=(",", ":"), ensure_ascii=True).encode()
    blobs: dict[str, np.ndarray[Any, Any]] = {
        **arrays,
        SPEC_BLOB: np.frombuffer(document, dtype=np.uint8),
    }
    check_can_hold(location)  # before any retraction: nothing lost
    check_not_committed(location, epoch, [node], overwrite=overwrite)
    commit = write_node(
        location,
        node,
        epoch,
        blobs,
        incremental=incremental,
        frozen=_frozen_blobs(tree, frozen, arrays),
    )
    commit_epoch(location, epoch, [commit])
    if manager is not None and manager.tiers is not None:
        manager.tiers.ensure(epoch, [node])


def _frozen_blobs(
    tree: object, keys: Collection[str | int | tuple[str | int, ...]], arrays: Mapping[str, object]
) -> list[str]:
    """The blobs under ``keys`` of ``tree``: top-level keys, or paths of keys (tuples)."""
    if not keys:
        return []
    paths = [key if isinstance(key, tuple) else (key,) for key in keys]
    missing = [path for path in paths if not path or not _holds(tree, path)]
    if missing:
        raise JobConfigurationError(
            f"frozen= names keys the tree does not have: {sorted(map(str, missing))[:5]}"
        )
    prefixes = {"/".join(encode_segment(key) for key in path) for path in paths}
    return [name for name in arrays if _under(name, prefixes)]


def _under(name: str, prefixes: Collection[str]) -> bool:
    """Whether blob ``name`` is one of ``prefixes`` or lies under one: a set lookup per
    level of the name (segments hold no ``/``), not a comparison per prefix (64 frozen
    layers of 256 blobs: 5 ms a save)."""
    end = len(name)
    while end != -1:
        if name[:end] in prefixes:
            return True
        end = name.rfind("/", 0, end)
    return False


def _holds(tree: object, path: tuple[str | int, ...]) -> bool:
    """Whether ``tree`` has a value at ``path`` (dict keys, sequence indices)."""
    for key in path:
        if isinstance(tree, Mapping):
            if key not in tree:
                return False
            tree = tree[key]
        elif isinstance(tree, list | tuple) and isinstance(key, int) and 0 <= key < len(tree):
            tree = tree[key]
        else:
            return False
    return True


def load_tree(
    target: TreeTarget,
    epoch: int | None = None,
    *,
    node: str = "tree",
    db_type: str = "zarr",
    adapter: ArrayAdapter | None = None,
) -> object:
    """Load the tree :func:`save_tree` saved, checked against its checksums.

    ``epoch`` defaults to the newest epoch committed for ``node``, as
    :func:`latest_tree_epoch` finds it. A checkpoint ``save_tree`` did not write (a
    Job's node checkpoint) raises :class:`~ckptstore.errors.CheckpointKindError`."""
    if epoch is not None:
        epoch = validate_epoch(epoch)
    validate_node_name(node)
    locations = _read_locations(target, node, db_type)
    if epoch is None:
        epoch = _newest(locations, node)
    chosen = epoch
    return first_serving(
        locations,
        lambda location: _read_tree(location, node, chosen, adapter),
        f"tree {node!r} of epoch {epoch}",
    )


def _read_tree(
    location: CheckpointLocation, node: str, epoch: int, adapter: ArrayAdapter | None
) -> object:
    """The tree stored as ``node``'s committed checkpoint of ``epoch`` under one root."""
    manifest = open_node(location, node, epoch)
    url = location.db_path(node, epoch)
    record = manifest.blobs.get(SPEC_BLOB)
    if record is None:  # the manifest is intact (checked against its commit record)
        raise CheckpointKindError(
            url,
            f"it has no {SPEC_BLOB!r} blob, so save_tree did not write it (a Job's node "
            "checkpoint?); read its blobs with CheckpointManager.load or `ckptstore inspect`, "
            "or pass node= the name the tree was saved under",
        )
    if record.nbytes > MAX_SPEC_BYTES or record.dtype != "|u1":
        raise CorruptCheckpointError(
            f"its tree spec is {record.nbytes} bytes of {record.dtype}", url=url, blob=SPEC_BLOB
        )
    raw = read_blobs(location, manifest, [SPEC_BLOB])[SPEC_BLOB]
    try:
        spec = json.loads(raw.tobytes())
    except (ValueError, RecursionError) as error:
        raise CorruptCheckpointError(f"its tree spec is not JSON: {error}", url=url) from None
    if not isinstance(spec, dict):
        raise CorruptCheckpointError("its tree spec is not a JSON object", url=url)
    names = [name for name in manifest.blobs if name != SPEC_BLOB]
    arrays = read_blobs(location, manifest, names)
    return unflatten(spec, arrays, adapter, url=url)


def latest_tree_epoch(target: TreeTarget, *, node: str = "tree", db_type: str = "zarr") -> int:
    """The newest epoch committed for ``node`` under ``target``, found as a resume does.

    That is one listing of the control directory, then the candidates' commit records,
    newest first. A damaged record is passed over with a warning. Raises
    :class:`~ckptstore.CheckpointNotFoundError` if there is none."""
    node = validate_node_name(node)
    return _newest(_read_locations(target, node, db_type), node)


def _newest(locations: Sequence[CheckpointLocation], node: str) -> int:
    """The newest epoch committed for ``node`` on any of ``locations``: the question
    resume asks (:meth:`~ckptstore.protocol.CommitListing.newest_complete`: one listing,
    then the candidates' records newest first; a damaged one is skipped with a warning)."""
    found = [CommitListing.of(where).newest_complete([node]) for where in locations]
    known = [epoch for epoch in found if epoch is not None]
    if known:
        return max(known)
    location = locations[0]
    raise CheckpointNotFoundError(
        location.storage.display_url,
        node,
        None,
        f"no committed tree {node!r} under {location.storage.display_url}: save one with "
        "save_tree first, or pass node= the name it was saved under",
    )
