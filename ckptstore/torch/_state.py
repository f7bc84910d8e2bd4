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

from collections.abc import Mapping
from typing import Any, Protocol

from ckptstore.errors import BlobNotFoundError
from ckptstore.torch._adapter import TorchAdapter
from ckptstore.tree import TreeTarget, latest_tree_epoch, load_tree, save_tree

__all__ = ["Stateful", "load_state", "restore", "save", "save_state"]

NODE = "torch"
_ADAPTER = TorchAdapter()


class Stateful(Protocol):
    """Anything with ``state_dict()`` and ``load_state_dict()``: modules, optimizers,
    LR schedulers, GradScalers."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state_dict: Any, /) -> Any: ...


def save_state(
    target: TreeTarget,
    epoch: int,
    state: Mapping[str, object],
    *,
    node: str = NODE,
    db_type: str = "zarr",
) -> None:
    """Save a tree of state dicts (tensors, nested dicts/lists/tuples, int, float,
    bool, None, str) as ``node``'s checkpoint of ``epoch`` under ``target``."""
    save_tree(target, epoch, dict(state), node=node, db_type=db_type, adapter=_ADAPTER)


def load_state(
    target: TreeTarget, epoch: int | None = None, *, node: str = NODE, db_type: str = "zarr"
) -> dict[str, Any]:
    """The tree :func:`save_state` saved (default: the newest epoch), tensors on the
    CPU, in the same structure, ready for ``load_state_dict``."""
    tree = load_tree(target, epoch, node=node, db_type=db_type, adapter=_ADAPTER)
    if not isinstance(tree, dict):
        raise TypeError(f"the checkpoint holds a {type(tree).__name__}, not a dict of states")
    return tree


def save(
    target: TreeTarget,
    epoch: int,
    *,
    node: str = NODE,
    db_type: str = "zarr",
    **objects: Stateful,
) -> None:
    """Save each object's ``state_dict()`` under its keyword's name."""
    save_state(
        target,
        epoch,
        {name: obj.state_dict() for name, obj in objects.items()},
        node=node,
        db_type=db_type,
    )


def restore(
    target: TreeTarget,
    epoch: int | None = None,
    *,
    node: str = NODE,
    db_type: str = "zarr",
    **objects: Stateful,
) -> int:
    """Load ``epoch`` (default: the newest) into each object with ``load_state_dict``;
    returns the epoch restored. A name the checkpoint lacks raises
    :class:`~ckptstore.BlobNotFoundError` before any object is changed."""
    if epoch is None:
        epoch = latest_tree_epoch(target, node=node, db_type=db_type)
    state = load_state(target, epoch, node=node, db_type=db_type)
    missing = sorted(set(objects) - set(state))
    if missing:
        raise BlobNotFoundError(
            missing,
            f"the torch checkpoint of epoch {epoch}",
            f"it holds {sorted(state)}; pass the names it was saved under",
        )
    for name, obj in objects.items():
        obj.load_state_dict(state[name])
    return epoch
