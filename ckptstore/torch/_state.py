"""Saving and restoring PyTorch state dicts (models, optimizers, schedulers, step
counters) as one committed checkpoint, without pickle.

Example::

    >>> import torch
    >>> model = torch.nn.Linear(2, 2)
    >>> save("./ckpt", 1, model=model)
    >>> save_state("./ckpt", 2, {"model": model.state_dict(), "step": 200})
    >>> restore("./ckpt", model=torch.nn.Linear(2, 2))  # the newest epoch
    2
    >>> load_state("./ckpt", 2)["step"]
    200
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, Protocol

from ckptstore.errors import (
    BlobNotFoundError,
    CheckpointKindError,
    CheckpointNotFoundError,
    JobConfigurationError,
)
from ckptstore.records import get_ckpt_filename, validate_epoch
from ckptstore.torch._adapter import TorchAdapter
from ckptstore.torch._fit import check_fits
from ckptstore.torch._sharded import (
    has_sharded_epoch,
    has_sharded_state,
    restore_sharded,
    save_sharded,
)
from ckptstore.tree import TreeTarget, latest_tree_epoch, load_tree, save_tree

__all__ = ["Stateful", "load_state", "restore", "save", "save_state"]

NODE = "torch"
_ADAPTER = TorchAdapter()


class Stateful(Protocol):
    """Anything with ``state_dict()`` and ``load_state_dict()``.

    Modules, optimizers, LR schedulers and GradScalers all are."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state_dict: Any, /) -> Any: ...


def save_state(
    target: TreeTarget,
    epoch: int,
    state: Mapping[str, object],
    *,
    node: str = NODE,
    db_type: str = "zarr",
    overwrite: bool = False,
    incremental: bool | None = None,
    frozen: Collection[str | int | tuple[str | int, ...]] = (),
) -> None:
    """Save a tree of state dicts as ``node``'s checkpoint of ``epoch`` under ``target``.

    The tree holds tensors, nested dicts/lists/tuples, int, float, bool, None and str.
    ``incremental`` and ``frozen``: as for :func:`~ckptstore.tree.save_tree`.

    Committed epochs are write-once, as with :func:`~ckptstore.tree.save_tree`: an
    epoch already committed raises :class:`~ckptstore.AlreadyCommittedError` (nothing
    written) unless ``overwrite=True``."""
    save_tree(
        target,
        epoch,
        dict(state),
        node=node,
        db_type=db_type,
        adapter=_ADAPTER,
        overwrite=overwrite,
        incremental=incremental,
        frozen=frozen,
    )


def load_state(
    target: TreeTarget, epoch: int | None = None, *, node: str = NODE, db_type: str = "zarr"
) -> dict[str, Any]:
    """Load the tree :func:`save_state` saved, ready for ``load_state_dict``.

    ``epoch`` defaults to the newest. Tensors come back on the CPU, in the same
    structure."""
    epoch = _epoch(target, epoch, node, db_type)
    tree = load_tree(target, epoch, node=node, db_type=db_type, adapter=_ADAPTER)
    if not isinstance(tree, dict):
        raise CheckpointKindError(
            get_ckpt_filename(node, epoch),
            f"it holds a {type(tree).__name__}, not a dict of states: it was saved with "
            "save_tree, not ckptstore.torch; read it with ckptstore.tree.load_tree",
        )
    return tree


def save(
    target: TreeTarget,
    epoch: int,
    *,
    node: str = NODE,
    db_type: str = "zarr",
    overwrite: bool = False,
    incremental: bool | None = None,
    frozen_keys: Collection[str | tuple[str | int, ...]] = (),
    **objects: Stateful,
) -> None:
    """Save each object's ``state_dict()`` under its keyword's name.

    Committed epochs are write-once, as with :func:`save_state`: ``overwrite=True``
    replaces one. ``incremental=True`` stores unchanged chunks once, as
    :func:`save_tree` does. ``frozen_keys`` (incremental, unsharded state only)
    names objects, or paths into their state dicts, whose tensors hold the bytes they
    had at this process's previous save: they are not read again (``frozen`` of
    :func:`save_tree`; not ``frozen``, which may name an object). A fine-tuned
    model's frozen parameters::

        frozen_keys=[("model", n) for n, p in model.named_parameters() if not p.requires_grad]

    Sharded state (a module or optimizer holding DTensors, or any state under an
    initialised process group of several ranks) is saved through
    ``torch.distributed.checkpoint`` on every rank, each rank its shards, with
    :class:`~ckptstore.torch.dcp.Writer` as its storage (write-once, no ``overwrite``;
    every rank calls :func:`save`)."""
    if has_sharded_state(objects):
        if frozen_keys:
            raise JobConfigurationError(
                "frozen_keys= is for unsharded state: a sharded save goes through "
                "torch.distributed.checkpoint, which reads every shard; drop frozen_keys="
            )
        save_sharded(
            target,
            epoch,
            objects,
            node=node,
            default_node=NODE,
            db_type=db_type,
            overwrite=overwrite,
            incremental=incremental,
        )
        return
    save_state(
        target,
        epoch,
        {name: obj.state_dict() for name, obj in objects.items()},
        node=node,
        db_type=db_type,
        overwrite=overwrite,
        incremental=incremental,
        frozen=frozen_keys,
    )


def restore(
    target: TreeTarget,
    epoch: int | None = None,
    *,
    node: str = NODE,
    db_type: str = "zarr",
    **objects: Stateful,
) -> int:
    """Load ``epoch`` into each object with ``load_state_dict``; return the epoch.

    ``epoch`` defaults to the newest. Before any object is changed, a name the checkpoint
    lacks raises :class:`~ckptstore.errors.BlobNotFoundError`, and a stored tensor of another
    shape or dtype than the one it would replace :class:`~ckptstore.errors.RestoreMismatchError`
    naming it.

    Sharded state (as for :func:`save`) and a root holding only sharded epochs are
    restored through ``torch.distributed.checkpoint`` with
    :class:`~ckptstore.torch.dcp.Reader`: the newest committed epoch (or ``epoch``),
    resharded to this job's ranks; a ckptstore error a rank raised comes out as itself."""
    if has_sharded_state(objects):
        return restore_sharded(
            target, epoch, objects, node=node, default_node=NODE, db_type=db_type
        )
    asked = epoch
    try:
        epoch = _epoch(target, epoch, node, db_type)
        state = load_state(target, epoch, node=node, db_type=db_type)
    except CheckpointNotFoundError:
        if node != NODE or not has_sharded_epoch(target, asked):
            raise
        return restore_sharded(
            target, asked, objects, node=node, default_node=NODE, db_type=db_type
        )
    missing = sorted(set(objects) - set(state))
    if missing:
        raise BlobNotFoundError(
            missing,
            f"the torch checkpoint of epoch {epoch}",
            f"it holds {sorted(state)}; pass the names it was saved under",
        )
    for name, obj in objects.items():
        check_fits(name, obj, state[name])
    for name, obj in objects.items():
        obj.load_state_dict(state[name])
    return epoch


def _epoch(target: TreeTarget, epoch: int | None, node: str, db_type: str) -> int:
    """``epoch`` checked, or the newest epoch committed for ``node``."""
    if epoch is not None:
        return validate_epoch(epoch)
    try:
        return latest_tree_epoch(target, node=node, db_type=db_type)
    except CheckpointNotFoundError as error:
        raise CheckpointNotFoundError(
            error.url,
            node,
            None,
            f"no committed torch state {node!r} under {error.url}: save one with "
            "ckptstore.torch.save (or save_state) first, or pass node= the name it was saved "
            "under",
        ) from None
