"""One rank of a real ``torch.distributed`` job (gloo, CPU) saving and loading through
``ckptstore.torch.dcp``; started by ``tests/torch/test_dcp.py`` as
``python dcp_ranks.py <scenario> <rank> <world> <port> <json args>``.

Every rank builds the same model from a seed: a DTensor-sharded (``Shard(0)``) MLP on a
CPU device mesh, with an Adam state after one step of fixed gradients, plus plain
tensors and non-tensor entries. ``save`` writes epochs through ``dcp.save`` and
``dcp.async_save`` and records the expected full tensors (``torch.save`` of a file the
test owns); ``load`` builds the model from another seed, loads an epoch, and checks
every value against them. Results (bytes read, bytes needed) go to ``<out>.<rank>.json``.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

import ckptstore.torch
from ckptstore.errors import AlreadyCommittedError
from ckptstore.torch.dcp import Reader, Writer

WIDE = 4096
"""Rows of the large layer: its weight (4096 x 1024 float32) is 16 MiB, so a rank of
four needs 4 MiB of it and of each of its Adam moments."""


def build(mesh: Any, seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(1024, WIDE), torch.nn.Linear(WIDE, 6))
    for layer in model:
        for name, param in list(layer.named_parameters()):
            sharded = distribute_tensor(param.data, mesh, [Shard(0)])
            layer.register_parameter(name, torch.nn.Parameter(sharded))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    for number, param in enumerate(model.parameters()):
        grad = torch.full(param.shape, 0.01 * (number + 1) + seed)
        grad[0] = -1.0  # rows differ: a shard loaded into the wrong place shows
        param.grad = distribute_tensor(grad, mesh, [Shard(0)])
    optimizer.step()
    optimizer.zero_grad()
    return model, optimizer


def state_of(model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int) -> dict[str, Any]:
    model_state, optim_state = get_state_dict(model, optimizer)
    return {
        "model": model_state,
        "optim": optim_state,
        "step": step,
        "name": f"run at step {step}",
        "loader": {"epoch": step, "offsets": [1, 2, step]},
        "rng": torch.arange(16, dtype=torch.uint8) + step,
        "plain": torch.arange(12.0).reshape(3, 4) * step,
    }


def full(value: Any) -> Any:
    """``value`` with every DTensor gathered (a collective: every rank calls it)."""
    if isinstance(value, DTensor):
        return value.full_tensor()
    if isinstance(value, dict):
        return {key: full(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(full(item) for item in value)
    return value


def same(actual: Any, expected: Any, where: str = "") -> None:
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), where
        assert actual.dtype == expected.dtype, where
        assert torch.equal(actual, expected), where
    elif isinstance(expected, dict):
        assert isinstance(actual, dict), where
        assert set(actual) == set(expected), where
        for key in expected:
            same(actual[key], expected[key], f"{where}/{key}")
    elif isinstance(expected, list | tuple):
        assert type(actual) is type(expected), where
        assert len(actual) == len(expected), where
        for number, (a, e) in enumerate(zip(actual, expected, strict=True)):
            same(a, e, f"{where}/{number}")
    else:
        assert actual == expected, (where, actual, expected)
        assert type(actual) is type(expected), where


class NeededPlanner(DefaultLoadPlanner):
    """The default planner, counting the bytes this rank asks for."""

    needed = 0

    def finish_plan(self, central_plan: Any) -> Any:
        plan = super().finish_plan(central_plan)
        for item in plan.items:
            if item.lengths is not None and item.type.name == "TENSOR":
                entry = self.metadata.state_dict_metadata[item.storage_index.fqn]
                self.needed += entry.properties.dtype.itemsize * int(
                    torch.tensor(list(item.lengths)).prod()
                )
        return plan

    def load_bytes(self, read_item: Any, value: Any) -> None:
        self.needed += len(value.getbuffer())
        super().load_bytes(read_item, value)


def counting(storage: Any) -> list[int]:
    """Count the data bytes read through local ``storage``: every read goes through a
    reader it opens (its ``read_into`` too), so wrapping ``open_reader`` of this
    instance sees them all."""
    count = [0]
    open_reader = storage.open_reader

    class CountedReader:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def __enter__(self) -> CountedReader:
            self.inner.__enter__()
            return self

        def __exit__(self, *exc: object) -> Any:
            return self.inner.__exit__(*exc)

        def read_into(self, offset: int, targets: Any) -> Any:
            count[0] += sum(memoryview(target).nbytes for target in targets)
            return self.inner.read_into(offset, targets)

        def close(self) -> None:
            self.inner.close()

    storage.open_reader = lambda key: CountedReader(open_reader(key))
    return count


def load_and_check(
    mesh: Any, reader: Reader, expected: dict[str, Any], *, planner: Any = None
) -> None:
    model, optimizer = build(mesh, seed=1)
    state = state_of(model, optimizer, step=0)
    dcp.load(state, storage_reader=reader, planner=planner)
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )
    got = full(state_of(model, optimizer, step=0)["model"]), full(state["optim"])
    same(got[0], expected["model"], "model")
    same(got[1], expected["optim"], "optim")
    for key in ("step", "name", "loader", "rng", "plain"):
        same(state[key], expected[key], key)


def fsdp_model(mesh: Any, seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """An MLP sharded with FSDP2 (``fully_shard``) and its Adam state after one step."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.Linear(96, 10))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    torch.manual_seed(100 + seed)
    model(torch.randn(5, 64)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    return model, optimizer


def two_lines(mesh: Any, root: str) -> dict[str, Any]:
    """Save epochs 1 and 2 with ``ckptstore.torch.save``, refuse epoch 2 again, and
    restore the newest into a model built from another seed; the full tensors must
    match. Rank 0 keeps the expected full state for the test's 1-process restore."""
    model, optimizer = fsdp_model(mesh, seed=0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3)
    ckptstore.torch.save(root, 1, model=model, optimizer=optimizer, scheduler=scheduler)
    scheduler.step()
    ckptstore.torch.save(root, 2, model=model, optimizer=optimizer, scheduler=scheduler)
    try:
        ckptstore.torch.save(root, 2, model=model, optimizer=optimizer)
        refused = ""
    except AlreadyCommittedError as error:  # typed, on every rank
        refused = type(error).__name__
    expected = full(get_state_dict(model, optimizer))
    twin, twin_optimizer = fsdp_model(mesh, seed=1)
    twin_scheduler = torch.optim.lr_scheduler.StepLR(twin_optimizer, step_size=3)
    assert not torch.equal(
        full(get_state_dict(twin, twin_optimizer))[0]["0.weight"], expected[0]["0.weight"]
    )
    epoch = ckptstore.torch.restore(
        root, model=twin, optimizer=twin_optimizer, scheduler=twin_scheduler
    )
    same(full(get_state_dict(twin, twin_optimizer)), expected, "restored")
    same(twin_scheduler.state_dict(), scheduler.state_dict(), "scheduler")
    if dist.get_rank() == 0:
        torch.save(expected, f"{root}.expected.pt")
    return {"epoch": epoch, "refused": refused}


def main() -> None:
    scenario, rank, world, port, raw = sys.argv[1:6]
    args = json.loads(raw)
    rank_, world_ = int(rank), int(world)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank_, world_size=world_
    )
    mesh = init_device_mesh("cpu", (world_,))
    out: dict[str, Any] = {}
    try:
        if scenario == "save":
            model, optimizer = build(mesh, seed=0)
            state = state_of(model, optimizer, step=5)
            for root, options in args["roots"]:
                dcp.save(state, storage_writer=Writer(root, epoch=5, storage_options=options))
            expected = full(state)
            if rank_ == 0:
                torch.save(expected, args["expected"])
            future = dcp.async_save(state, storage_writer=Writer(args["roots"][0][0], epoch=6))
            future.result()
            for root, options in args["roots"]:  # N -> N, every path type
                load_and_check(mesh, Reader(root, epoch=5, storage_options=options), expected)
            load_and_check(mesh, Reader(args["roots"][0][0]), expected)  # the async save
            if "one_rank_root" in args:  # 1 -> N
                one = torch.load(args["one_rank_expected"], weights_only=True)
                load_and_check(mesh, Reader(args["one_rank_root"]), one)
        elif scenario == "load":
            expected = torch.load(args["expected"], weights_only=True)
            reader = Reader(args["root"], epoch=5)
            count = counting(reader.storage)
            planner = NeededPlanner()
            load_and_check(mesh, reader, expected, planner=planner)
            out = {"read": count[0], "reader_read": reader.bytes_read, "needed": planner.needed}
        elif scenario == "two_lines":  # ckptstore.torch.save/restore of an FSDP2 model
            out = two_lines(mesh, args["root"])
        elif scenario == "race":  # each rank is a job of its own; the group is a barrier
            state = {"w": torch.full((256, 256), float(rank_)), "who": rank_}
            writer = Writer(args["root"], epoch=9)  # both pass: nothing is committed yet
            dist.barrier()
            try:
                dcp.save(state, storage_writer=writer, no_dist=True)
                out = {"won": True}
            except CheckpointException as error:
                cause = next(iter(error.failures.values()))[0]
                out = {"won": False, "cause": type(cause).__name__}
        else:
            raise SystemExit(f"unknown scenario {scenario!r}")
        # The result is written before teardown: the test reads it only if every rank
        # also exits 0, so a failure in teardown still fails the test.
        Path(f"{args['out']}.{rank_}.json").write_text(json.dumps(out))
        dist.barrier()  # no rank tears down while another still talks to it
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    faulthandler.enable()  # a C++ abort (std::terminate) prints the Python stack
    main()
    # gloo's C++ threads can abort during interpreter finalisation after a clean
    # teardown (pytorch/pytorch#179291); everything this rank checks is done and
    # written by now, so leave without running the C++ destructors again.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
