"""Jobs of forked gloo ranks saving and loading through ``ckptstore.torch.dcp``.

    python dcp_fork_jobs.py <work dir> matrix <N:M,N:M,...> <out.json> [<base> <options>]

saves with N ranks and loads (and checks, on the loading ranks) on M for each pair,
under ``<base>`` (default: the work dir; any ckptstore root, with storage options as
JSON).

SIGKILL one rank of a 2-rank gloo job at every file-system write boundary of
``dcp.save`` or ``dcp.async_save`` through ``ckptstore.torch.dcp.Writer``; started by
``tests/torch/test_dcp_kill.py`` as

    python dcp_fork_jobs.py <work dir> <mode: save|async> <every> <out.json>

The driver imports torch once and forks each job's ranks (no process group, thread or
file of its own is open while it forks). A first job saves epoch 1 (the template); a
counting job saves epoch 2 with no kill and reports each rank's number of counted calls
(``kill_points.count_file_system_writes``). Then, for each rank r and each K in
1..calls[r] (every ``every``-th one, and always the last), a job saves epoch 2 on a copy
of the template, rank r dying by SIGKILL at its K-th call; the other rank is then
killed too (a launcher tears the job down). Only after every job is done does the
driver check each copy, in this process without ``torch.distributed``: the newest epoch
``Reader`` accepts loads exactly its saved state, an epoch 2 it does not accept is not
committed, and epoch 1 still loads exactly.
"""

from __future__ import annotations

import json
import multiprocessing
import shutil
import socket
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: kill_points

import torch
import torch._dynamo  # DTensor's first use imports it: 3-4 s in every fork
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from kill_points import KillAt, count_file_system_writes
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

from ckptstore.errors import CheckpointNotFoundError
from ckptstore.plugin import get_registry
from ckptstore.protocol import CheckpointLocation, committed_nodes
from ckptstore.torch.dcp import Reader, Writer

WORLD = 2
OPTIONS: dict[str, Any] | None = None
"""Storage options of the roots (set before the ranks fork, so they inherit them)."""


def full_state(epoch: int) -> dict[str, Any]:
    """The state saved for ``epoch``, as full tensors: ``w`` and ``b`` are sharded
    along dim 0, ``c`` along dim 1 (uneven shards: 7 rows of ``b`` and 5 columns of
    ``c`` over 2, 3 or 4 ranks, 64 rows of ``w`` over 3), plus non-tensor entries."""
    return {
        "w": torch.arange(64 * 48, dtype=torch.float32).reshape(64, 48) + 1000 * epoch,
        "b": torch.arange(7 * 5, dtype=torch.int64).reshape(7, 5) - epoch,
        "c": torch.arange(3 * 5, dtype=torch.bfloat16).reshape(3, 5) * epoch,
        "step": epoch,
        "tag": f"epoch {epoch}",
        "loader": {"epoch": epoch, "seen": [epoch, 2 * epoch]},
    }


def sharded(state: dict[str, Any], mesh: Any) -> dict[str, Any]:
    """``state`` with its tensors as DTensors on ``mesh`` (``c`` along dim 1)."""
    return {
        key: distribute_tensor(value, mesh, [Shard(1 if key == "c" else 0)])
        if isinstance(value, torch.Tensor)
        else value
        for key, value in state.items()
    }


def rank_main(
    rank: int,
    world: int,
    port: int,
    root: str,
    epoch: int,
    mode: str,
    kill_rank: int,
    kill_at: int,
) -> None:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    mesh = init_device_mesh("cpu", (world,))
    if mode == "load":
        load_on_ranks(root, epoch, mesh)
        dist.destroy_process_group()
        return
    state = sharded(full_state(epoch), mesh)
    killer = KillAt(kill_at if rank == kill_rank else 0)
    count_file_system_writes(killer)
    writer = Writer(root, epoch=epoch, storage_options=OPTIONS)
    if mode == "async":
        dcp.async_save(state, storage_writer=writer).result()
    else:
        dcp.save(state, storage_writer=writer)
    if "://" not in root:
        Path(f"{root}.calls.{rank}").write_text(str(killer.calls))
    dist.destroy_process_group()


def load_on_ranks(root: str, epoch: int, mesh: Any) -> None:
    """Load ``epoch`` into zeroed DTensors of this job's sharding; check the gathered
    tensors and every non-tensor entry against the state saved."""
    expected = full_state(epoch)
    state = sharded(full_target(), mesh)
    dcp.load(state, storage_reader=Reader(root, epoch, OPTIONS))
    for key, value in expected.items():
        got = state[key]
        if isinstance(value, torch.Tensor):
            got = got.full_tensor()
            assert got.dtype == value.dtype, (key, got.dtype)
            assert torch.equal(got, value), (key, got, value)
        else:
            assert got == value, (key, got, value)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run_job(
    root: Path | str, epoch: int, mode: str, kill_rank: int, kill_at: int, world: int = WORLD
) -> bool:
    """One job of ``world`` ranks (``mode``: save, async or load); whether its rank
    ``kill_rank`` died by SIGKILL."""
    context = multiprocessing.get_context("fork")
    port = free_port()
    ranks = [
        context.Process(
            target=rank_main,
            args=(rank, world, port, str(root), epoch, mode, kill_rank, kill_at),
        )
        for rank in range(world)
    ]
    for process in ranks:
        process.start()
    ranks[kill_rank].join(timeout=300)
    killed = ranks[kill_rank].exitcode == -9
    for process in ranks:
        if killed and process.is_alive():
            process.kill()
        process.join(timeout=300)
    if not killed and any(process.exitcode != 0 for process in ranks):
        raise SystemExit(f"a job without a kill failed: {[p.exitcode for p in ranks]}")
    return killed


def blank(value: Any) -> Any:
    """``value``'s structure with zeroed tensors and empty leaves (DCP loads into the
    keys its target has)."""
    if isinstance(value, torch.Tensor):
        return torch.zeros_like(value)
    if isinstance(value, dict):
        return {key: blank(item) for key, item in value.items()}
    if isinstance(value, list):
        return [blank(item) for item in value]
    return type(value)()


def full_target() -> dict[str, Any]:
    """What a load fills: the saved structure, zeroed."""
    return blank(full_state(1))


def loads_exactly(root: Path, epoch: int | None) -> int:
    """Load ``epoch`` (the newest if None) in this process; check it against the state
    saved for it; return its epoch."""
    reader = Reader(root, epoch)
    state = full_target()
    dcp.load(state, storage_reader=reader, no_dist=True)
    expected = full_state(reader.epoch)
    for key, value in expected.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(state[key], value), (root, reader.epoch, key)
        else:
            assert state[key] == value, (root, reader.epoch, key, state[key])
    return reader.epoch


def check(root: Path) -> dict[str, Any]:
    newest = loads_exactly(root, None)
    assert loads_exactly(root, 1) == 1
    storage = CheckpointLocation.open(str(root), "zarr").storage
    if newest == 1:
        try:
            Reader(root, epoch=2)
            raise AssertionError(f"{root}: Reader accepts epoch 2 but not as the newest")
        except CheckpointNotFoundError:
            pass
        assert "dcp" not in committed_nodes(storage, 2)
    return {"newest": newest}


def matrix(base: str, pairs: list[tuple[int, int]], out: str) -> None:
    """Save with N ranks under ``<base>/saved-by-<N>``, load on M, for each ``N:M``
    pair (each save once)."""
    for saving in sorted({n for n, _ in pairs}):
        run_job(f"{base}/saved-by-{saving}", 1, "save", 0, 0, world=saving)
    for saving, loading in pairs:
        run_job(f"{base}/saved-by-{saving}", 1, "load", 0, 0, world=loading)
    Path(out).write_text(json.dumps({"pairs": pairs}))


def main() -> None:
    get_registry()  # the plugins, found once here rather than in every fork
    if sys.argv[2] == "matrix":
        global OPTIONS
        pairs = [tuple(map(int, pair.split(":"))) for pair in sys.argv[3].split(",")]
        base = sys.argv[5] if len(sys.argv) > 5 else sys.argv[1]
        OPTIONS = json.loads(sys.argv[6]) if len(sys.argv) > 6 else None
        matrix(base, pairs, sys.argv[4])  # type: ignore[arg-type]
        return
    work, mode, every, out = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    template = work / "template"
    run_job(template, 1, "save", 0, 0)
    counting = work / "counting"
    shutil.copytree(template, counting)
    run_job(counting, 2, mode, 0, 0)
    calls = [int(Path(f"{counting}.calls.{rank}").read_text()) for rank in range(WORLD)]
    trials = []
    for rank in range(WORLD):
        points = sorted({*range(1, calls[rank] + 1, every), calls[rank]})
        for kill_at in points:
            root = work / f"{mode}-{rank}-{kill_at}"
            shutil.copytree(template, root)
            killed = run_job(root, 2, mode, rank, kill_at)
            trials.append({"rank": rank, "kill_at": kill_at, "killed": killed, "root": str(root)})
    for trial in trials:  # only now: this process reads (with threads) after its last fork
        trial.update(check(Path(trial["root"])))
    check(counting)
    Path(out).write_text(json.dumps({"calls": calls, "trials": trials}))


if __name__ == "__main__":
    main()
