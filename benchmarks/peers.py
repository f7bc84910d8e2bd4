"""Save and restore functions for ckptstore and every tool it is compared with.

Every ``save`` returns only once the data is durable (fsync, or a file-system-wide
``syncfs`` for tools that write many files and have no sync of their own), so all
tools are measured on the same footing. Every ``load`` returns the blobs as numpy
arrays (or torch tensors) in memory.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

Blobs = dict[str, np.ndarray]
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def syncfs(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        _libc.syncfs(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fsync_dir)
    finally:
        os.close(fsync_dir)


# -- the disk itself ------------------------------------------------------------------


def raw_save(blobs: Blobs, target: Path) -> None:
    """One large sequential write of the same bytes, then fsync: the disk's limit."""
    target.mkdir(parents=True, exist_ok=True)
    fd = os.open(target / "raw.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        for array in blobs.values():
            view = memoryview(array).cast("B")
            while view:
                view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def raw_load(template: Blobs, target: Path) -> Blobs:
    out = {name: np.empty_like(array) for name, array in template.items()}
    fd = os.open(target / "raw.bin", os.O_RDONLY)
    try:
        for array in out.values():
            view = memoryview(array).cast("B")
            while view:
                view = view[os.readv(fd, [view]) :]
    finally:
        os.close(fd)
    return out


# -- ckptstore --------------------------------------------------------------------------


def ckptstore_save(db_type: Any, blobs: Blobs, target: Path) -> None:
    from ckptstore import LocalPath, get_registry
    from ckptstore.io import ParallelIO
    from ckptstore.protocol._commit import commit_epoch, write_node

    storage = LocalPath(str(target))
    db = get_registry().db_type(db_type)
    io = ParallelIO(storage.default_io.with_environment())
    commit_epoch(storage, 1, [write_node(storage, "node", 1, blobs, db, io)])


def ckptstore_load(template: Blobs, target: Path, verify: bool = True) -> Blobs:
    from ckptstore import LocalPath, get_registry
    from ckptstore.io import ParallelIO
    from ckptstore.protocol._commit import open_node, read_blobs

    storage = LocalPath(str(target))
    manifest = open_node(storage, "node", 1)
    db = get_registry().db_type(manifest.db_type)
    settings = storage.default_io.with_environment().merged(verify=verify)
    return read_blobs(storage, manifest, None, db, ParallelIO(settings))


def ckptstore_partial_load(blob: str, target: Path) -> np.ndarray:
    """Load one blob of a ckptstore checkpoint (reads only that blob's bytes)."""
    from ckptstore import LocalPath, get_registry
    from ckptstore.io import ParallelIO
    from ckptstore.protocol._commit import open_node, read_blobs

    storage = LocalPath(str(target))
    manifest = open_node(storage, "node", 1)
    db = get_registry().db_type(manifest.db_type)
    return read_blobs(storage, manifest, [blob], db, ParallelIO(storage.default_io))[blob]


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


Tool = tuple[Callable[[Blobs, Path], None], Callable[[Blobs, Path], Any]]


def tools() -> dict[str, Tool]:
    """Every tool by name: (save, load)."""
    from functools import partial

    table: dict[str, Tool] = {
        "disk (raw write/read)": (raw_save, raw_load),
        "ckptstore zarr": (partial(ckptstore_save, "zarr"), ckptstore_load),
        "ckptstore zarr, no verify": (
            partial(ckptstore_save, "zarr"),
            partial(ckptstore_load, verify=False),
        ),
        "ckptstore npz": (partial(ckptstore_save, "npz"), ckptstore_load),
        "np.savez": (savez_save, savez_load),
        "safetensors": (safetensors_save, safetensors_load),
        "torch.save": (torch_save, torch_load),
        "torch.distributed.checkpoint": (dcp_save, dcp_load),
        "zarr-python": (zarr_save, zarr_load),
    }
    try:
        from ckptstore import get_registry

        if "lmdb" in get_registry().db_types:
            table["ckptstore lmdb"] = (partial(ckptstore_save, "lmdb"), ckptstore_load)
    except ImportError:
        pass
    return table


def remove(target: Path) -> None:
    shutil.rmtree(target, ignore_errors=True)
