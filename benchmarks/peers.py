"""Save and restore functions for ckptstore and every tool it is compared with.

Every ``save`` returns only once the data is durable (fsync, or a file-system-wide
``syncfs`` for tools that write many files and have no sync of their own), so all
tools are measured on the same footing. Every ``load`` returns the blobs as numpy
arrays (or torch tensors) in memory.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.system import environment_variable, fsync_file, syncfs

Blobs = dict[str, np.ndarray]
# -- ckptstore (its public API only) ---------------------------------------------------

NODE = "node"


def _manager(db_type: str, target: Path) -> Any:
    from ckptstore import CheckpointManager

    return CheckpointManager(str(target), NODE, db_type)


def ckptstore_save(db_type: str, blobs: Blobs, target: Path) -> None:
    """``CheckpointManager.save`` of ``blobs`` as epoch 1 (durable and committed)."""
    from ckptstore import LocalSession, Node

    session = LocalSession()
    session.workspace(NODE).update(blobs)
    manager = _manager(db_type, target)
    with Node(NODE):
        session.run(manager.init([NODE]))
    session.run(manager.save(1))


def ckptstore_load(db_type: str, template: Blobs, target: Path, verify: bool = True) -> Blobs:
    """``CheckpointManager.load`` of epoch 1, its checksums checked or not as ``verify``
    says whatever the environment does (``CKPTSTORE_IO_VERIFY``, for this load only)."""
    from ckptstore import LocalSession, Node

    with environment_variable("CKPTSTORE_IO_VERIFY", "1" if verify else "0"):
        session = LocalSession()
        manager = _manager(db_type, target)
        with Node(NODE):
            session.run(manager.init([NODE], retrieve_from_epoch=1))
        session.run(manager.load(1))
    return dict(session.workspace(NODE))


def ckptstore_partial_load(db_type: str, blob: str, target: Path) -> np.ndarray:
    """Load one blob of a ckptstore checkpoint (reads only that blob's bytes)."""
    from ckptstore import LocalSession, Node

    session = LocalSession()
    manager = _manager(db_type, target)
    with Node(NODE):
        session.run(manager.load_blobs_from_checkpoint([blob], 1))
    return session.workspace(NODE)[blob]


# -- numpy, safetensors, torch, zarr-python --------------------------------------------------


def savez_save(blobs: Blobs, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    np.savez(target / "state.npz", **{name.replace("/", "."): a for name, a in blobs.items()})
    fsync_file(target / "state.npz")


def savez_load(template: Blobs, target: Path) -> Blobs:
    with np.load(target / "state.npz", allow_pickle=False) as npz:
        return {name: npz[name.replace("/", ".")] for name in template}


def safetensors_save(blobs: Blobs, target: Path) -> None:
    from safetensors.numpy import save_file

    target.mkdir(parents=True, exist_ok=True)
    save_file(blobs, str(target / "state.safetensors"))
    fsync_file(target / "state.safetensors")


def safetensors_load(template: Blobs, target: Path) -> Blobs:
    from safetensors.numpy import load_file

    return load_file(str(target / "state.safetensors"))


def _tensors(blobs: Blobs) -> dict[str, Any]:
    import torch

    return {name: torch.from_numpy(array) for name, array in blobs.items()}


def torch_save(blobs: Blobs, target: Path) -> None:
    import torch

    target.mkdir(parents=True, exist_ok=True)
    torch.save(_tensors(blobs), target / "state.pt")
    fsync_file(target / "state.pt")


def torch_load(template: Blobs, target: Path) -> Any:
    import torch

    return torch.load(target / "state.pt", weights_only=True)


def dcp_save(blobs: Blobs, target: Path) -> None:
    import torch.distributed.checkpoint as dcp

    dcp.save(_tensors(blobs), storage_writer=dcp.FileSystemWriter(str(target), sync_files=True))


def dcp_load(template: Blobs, target: Path) -> Any:
    import torch
    import torch.distributed.checkpoint as dcp

    state = {
        name: torch.empty(array.shape, dtype=torch.float32) for name, array in template.items()
    }
    dcp.load(state, storage_reader=dcp.FileSystemReader(str(target)))
    return state


def zarr_save(blobs: Blobs, target: Path) -> None:
    import zarr

    group = zarr.open_group(str(target), mode="w", zarr_format=3)
    for name, array in blobs.items():
        group.create_array(name, data=array)  # zarr-python's defaults, one array per blob
    syncfs(target)


def zarr_load(template: Blobs, target: Path) -> Blobs:
    import zarr

    group = zarr.open_group(str(target), mode="r")
    return {name: group[name][...] for name in template}


def tensorstore_save(blobs: Blobs, target: Path) -> None:
    """One zarr v3 array per blob written by tensorstore (all writes in flight at once)."""
    import tensorstore as ts

    opening = {
        name: ts.open(
            {
                "driver": "zarr3",
                "kvstore": {"driver": "file", "path": str(target / name)},
                "metadata": {"shape": list(array.shape), "data_type": str(array.dtype)},
                "create": True,
                "delete_existing": True,
            }
        )
        for name, array in blobs.items()
    }
    writes = [future.result().write(blobs[name]) for name, future in opening.items()]
    for write in writes:
        write.result()
    syncfs(target)


def tensorstore_load(template: Blobs, target: Path) -> Blobs:
    import tensorstore as ts

    stores = {
        name: ts.open(
            {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(target / name)}}
        )
        for name in template
    }
    futures = {name: store.result().read() for name, store in stores.items()}
    return {name: np.asarray(future.result()) for name, future in futures.items()}


Tool = tuple[Callable[[Blobs, Path], None], Callable[[Blobs, Path], Any]]


def installed(module: str) -> bool:
    """Whether ``module`` can be imported (peers from the ``bench`` extra may be missing)."""
    import importlib.util

    return importlib.util.find_spec(module) is not None


def ckptstore_formats() -> list[str]:
    """The ckptstore formats to measure: zarr, npz, and lmdb when its plugin is installed."""
    from ckptstore.plugin import get_registry

    return [name for name in ("zarr", "npz", "lmdb") if name in get_registry().db_types]


def tools() -> dict[str, Tool]:
    """Every installed tool by name: (save, load)."""
    from functools import partial

    table: dict[str, Tool] = {}
    for db_type in ckptstore_formats():
        table[f"ckptstore {db_type}"] = (
            partial(ckptstore_save, db_type),
            partial(ckptstore_load, db_type),
        )
        if db_type == "zarr":
            table["ckptstore zarr, no verify"] = (
                partial(ckptstore_save, db_type),
                partial(ckptstore_load, db_type, verify=False),
            )
    peers: dict[str, tuple[str, Tool]] = {
        "np.savez": ("numpy", (savez_save, savez_load)),
        "safetensors": ("safetensors", (safetensors_save, safetensors_load)),
        "torch.save": ("torch", (torch_save, torch_load)),
        "torch.distributed.checkpoint": ("torch", (dcp_save, dcp_load)),
        "tensorstore": ("tensorstore", (tensorstore_save, tensorstore_load)),
        "zarr-python": ("zarr", (zarr_save, zarr_load)),
    }
    for name, (module, tool) in peers.items():
        if installed(module):
            table[name] = tool
    return table


def remove(target: Path) -> None:
    shutil.rmtree(target, ignore_errors=True)
