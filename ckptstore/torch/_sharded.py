"""``ckptstore.torch.save/restore`` for sharded state: through DCP on every rank.

When a model or optimizer holds DTensors (DTensor, FSDP2, tensor parallelism), or a
process group of more than one rank is initialised, :func:`ckptstore.torch.save` and
:func:`ckptstore.torch.restore` hand the state to ``torch.distributed.checkpoint``
with :class:`~ckptstore.torch.dcp.Writer` / :class:`~ckptstore.torch.dcp.Reader` as
its storage. Modules and optimizers go through DCP's ``get_model_state_dict`` /
``get_optimizer_state_dict`` (keys by parameter name, so a load on another number of
ranks or another sharding finds them); anything else's ``state_dict()`` is saved as is.

A ckptstore error a rank raised inside DCP (which wraps it in its
``CheckpointException``) is raised again as itself, so a caller catches
``CorruptCheckpointError`` or ``AlreadyCommittedError`` as with a plain state.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ckptstore.checkpoint import ManagerBase
from ckptstore.errors import JobConfigurationError
from ckptstore.protocol import CheckpointLocation, CommitListing, committed_nodes

if TYPE_CHECKING:
    from ckptstore.torch._state import Stateful
    from ckptstore.tree import TreeTarget

__all__ = ["has_sharded_epoch", "has_sharded_state", "restore_sharded", "save_sharded"]


def _group_of_several() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _tensors_of(obj: object) -> Iterator[object]:
    if isinstance(obj, torch.nn.Module):
        yield from obj.parameters()
        yield from obj.buffers()
    elif isinstance(obj, torch.optim.Optimizer):
        for group in obj.param_groups:
            yield from group["params"]


def has_sharded_state(objects: Mapping[str, object]) -> bool:
    """Whether the save or restore of ``objects`` goes through DCP: a process group of
    more than one rank is initialised, or a module or optimizer holds a DTensor."""
    if _group_of_several():
        return True
    if not dist.is_available():
        return False
    from torch.distributed.tensor import DTensor

    return any(
        isinstance(tensor, DTensor) for obj in objects.values() for tensor in _tensors_of(obj)
    )


def has_sharded_epoch(target: TreeTarget, epoch: int | None) -> bool:
    """Whether ``target`` holds a committed DCP epoch (``epoch``, or any)."""
    from ckptstore.torch.dcp import METADATA_NODE

    root, options = _root(target)
    storage = CheckpointLocation.open(root, "zarr", storage_options=options).storage
    if epoch is None:
        return CommitListing.of(storage).newest_complete([METADATA_NODE]) is not None
    return METADATA_NODE in committed_nodes(storage, epoch)


def _root(target: TreeTarget) -> tuple[str, Mapping[str, object] | None]:
    if isinstance(target, ManagerBase):
        target = target.location
    if isinstance(target, CheckpointLocation):
        if target.db_type.name != "zarr":
            raise JobConfigurationError(
                f"sharded state is stored as zarr, not {target.db_type.name}: open the "
                "location with db_type='zarr'"
            )
        return target.prefix, target.storage_options
    return str(target), None


def _check_options(node: str, default_node: str, db_type: str, overwrite: bool) -> None:
    if node != default_node:
        raise JobConfigurationError(
            f"sharded state is saved as the nodes 'dcp' and 'rank_<r>', not {node!r}: "
            "leave node= unset (one sharded state per root)"
        )
    if db_type != "zarr":
        raise JobConfigurationError(f"sharded state is stored as zarr, not {db_type!r}")
    if overwrite:
        raise JobConfigurationError(
            "a sharded epoch is write-once: save under a new epoch instead of overwrite=True"
        )


def _owner(optimizer: torch.optim.Optimizer, modules: list[torch.nn.Module], name: str) -> Any:
    wanted = {id(param) for group in optimizer.param_groups for param in group["params"]}
    for module in modules:
        if wanted <= {id(param) for param in module.parameters()}:
            return module
    raise JobConfigurationError(
        f"the optimizer {name!r} updates parameters of no module passed with it: pass "
        "the model it trains too (model=..., optimizer=...)"
    )


def _state_of(objects: Mapping[str, Stateful]) -> dict[str, Any]:
    """What DCP saves for each object (and, on restore, the structure it loads into)."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    modules = [obj for obj in objects.values() if isinstance(obj, torch.nn.Module)]
    state: dict[str, Any] = {}
    for name, obj in objects.items():
        if isinstance(obj, torch.nn.Module):
            state[name] = get_model_state_dict(obj)
        elif isinstance(obj, torch.optim.Optimizer):
            state[name] = get_optimizer_state_dict(_owner(obj, modules, name), obj)
        else:
            state[name] = obj.state_dict()
    return state


def save_sharded(
    target: TreeTarget,
    epoch: int,
    objects: Mapping[str, Stateful],
    *,
    node: str,
    default_node: str,
    db_type: str,
    overwrite: bool,
    incremental: bool | None = None,
) -> None:
    """Save ``objects`` through DCP, every rank its shards, as ``epoch`` under ``target``
    (``incremental``: see :class:`~ckptstore.torch.dcp.Writer`; ``None`` takes a
    location's own setting)."""
    from torch.distributed.checkpoint.state_dict_saver import save

    from ckptstore.torch.dcp import Writer, typed_errors

    _check_options(node, default_node, db_type, overwrite)
    root, options = _root(target)
    if incremental is None:
        location = target.location if isinstance(target, ManagerBase) else target
        incremental = isinstance(location, CheckpointLocation) and location.incremental
    writer = Writer(root, epoch, options, incremental=incremental)
    state = _state_of(objects)
    with typed_errors():
        save(state, storage_writer=writer, no_dist=not dist.is_initialized())


def restore_sharded(
    target: TreeTarget,
    epoch: int | None,
    objects: Mapping[str, Stateful],
    *,
    node: str,
    default_node: str,
    db_type: str,
) -> int:
    """Load ``epoch`` (default: the newest committed DCP epoch) through DCP into
    ``objects``, resharded to this job's ranks and sharding; returns the epoch."""
    from torch.distributed.checkpoint.state_dict import (
        set_model_state_dict,
        set_optimizer_state_dict,
    )
    from torch.distributed.checkpoint.state_dict_loader import load

    from ckptstore.torch.dcp import Reader, typed_errors

    _check_options(node, default_node, db_type, overwrite=False)
    root, options = _root(target)
    reader = Reader(root, epoch, options)
    modules = [obj for obj in objects.values() if isinstance(obj, torch.nn.Module)]
    state = _state_of(objects)
    with typed_errors():
        load(state, storage_reader=reader, no_dist=not dist.is_initialized())
    for name, obj in objects.items():
        if isinstance(obj, torch.nn.Module):
            set_model_state_dict(obj, state[name])
        elif isinstance(obj, torch.optim.Optimizer):
            set_optimizer_state_dict(_owner(obj, modules, name), obj, state[name])
        else:
            obj.load_state_dict(state[name])
    return reader.epoch
