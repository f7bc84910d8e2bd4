"""Jobs of forked gloo ranks saving and loading through ``ckptstore.torch.dcp``.

    python dcp_fork_jobs.py <work dir> matrix <N:M,N:M,...> <out.json> [<base> <options>]

saves with N ranks and loads (and checks, on the loading ranks) on M for each pair,
under ``<base>`` (default: the work dir; any ckptstore root, with storage options as
JSON).

SIGKILL one rank of a 2-rank gloo job at every file-system write boundary of
``dcp.save`` or ``dcp.async_save`` through ``ckptstore.torch.dcp.Writer`` (with
``<base> <options>``: at every S3 request that can change the bucket, under ``<base>``
on an S3 server, ``kill_points.count_s3_writes``); started by
``tests/torch/test_dcp_jobs.py`` as

    python dcp_fork_jobs.py <work dir> <mode: save|async> <points> <out.json> [<base> <options>]

Incremental saves (``Writer(..., incremental=True)`` through ``ckptstore.torch.save``):

    python dcp_fork_jobs.py <work dir> incremental <out.json> [<base> <options>]

saves epochs 1-3 (:data:`VERSIONS`) on 2 ranks, then checks loads, ``cp``,
``cp --materialize``, ``ls``, ``verify`` and ``gc --keep-last 1`` (:func:`incremental`).

The driver imports torch once and forks each job's ranks (no process group, thread or
file of its own is open while it forks). A first job saves epoch 1 (the template;
on S3 each job saves its epoch 1 itself before the counted epoch 2); a
counting job saves epoch 2 with no kill and reports each rank's number of counted calls
(``kill_points.count_file_system_writes``). Then, for each rank r and each K in
1..calls[r] (``<points>``: every N-th one and always the last; or a list
``<rank>:<K>,...``, a negative K counting from the last), a job saves epoch 2 on a copy
of the template, rank r dying by SIGKILL at its K-th call; the other rank is then
killed too (a launcher tears the job down). Only after every job is done does the
driver check each copy, in this process without ``torch.distributed``: the newest epoch
``Reader`` accepts loads exactly its saved state, an epoch 2 it does not accept is not
committed, epoch 1 still loads exactly, and ``ckptstore verify`` finds every committed
node checkpoint intact.
"""

from __future__ import annotations

import contextlib
import io
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
from kill_points import KillAt, count_file_system_writes, count_s3_writes
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

import ckptstore.torch
from ckptstore.cli import main as ckptstore_main
from ckptstore.errors import CheckpointNotFoundError
from ckptstore.io._shared_keys import CHUNK_STORE_DIR
from ckptstore.plugin import get_registry
from ckptstore.protocol import CheckpointLocation, committed_nodes
from ckptstore.protocol._chunks import INTENTS_DIR
from ckptstore.torch.dcp import Reader, Writer, _released_before

WORLD = 2
OPTIONS: dict[str, Any] | None = None
"""Storage options of the roots (set before the ranks fork, so they inherit them)."""
WORK = Path(".")
"""Where ranks write their numbers of counted calls (``<root's name>.calls.<rank>``)."""


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
    if mode == "incremental":
        save_incrementally(root, epoch, mesh)
        dist.destroy_process_group()
        return
    if "://" in root and epoch == 2:  # epoch 1 first, by this job (see main)
        first = Writer(root, epoch=1, storage_options=OPTIONS)
        dcp.save(sharded(full_state(1), mesh), storage_writer=first)
        _released_before()  # its lease's release (a thread of its own) is not counted
    state = sharded(full_state(epoch), mesh)
    killer = KillAt(kill_at if rank == kill_rank else 0)
    if "://" in root:
        count_s3_writes(killer)
    else:
        count_file_system_writes(killer)
    writer = Writer(root, epoch=epoch, storage_options=OPTIONS)
    if mode == "async":
        dcp.async_save(state, storage_writer=writer).result()
    else:
        dcp.save(state, storage_writer=writer)
    _released_before()  # the release of the lease is the coordinator's last request
    WORK.joinpath(f"{_name(root)}.calls.{rank}").write_text(str(killer.calls))
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


def _name(root: Path | str) -> str:
    return str(root).rstrip("/").rpartition("/")[2]


def _storage(root: Path | str) -> Any:
    return CheckpointLocation.open(str(root), "zarr", storage_options=OPTIONS).storage


VERSIONS = {1: 1, 2: 1, 3: 2}
"""The version of :func:`incremental_state` each epoch of the incremental job saves:
epoch 2 saves epoch 1's state again, epoch 3 a changed one."""


def incremental_state(version: int) -> dict[str, Any]:
    """A 16 MiB frozen ``base`` (two 4 MiB chunks of the chunk store per rank), an
    8 MiB ``emb`` whose first rows change with ``version`` (one chunk per rank, rank
    0's changes) and a small ``head`` and ``step`` (in the ranks' archives)."""
    emb = torch.arange(2048 * 1024, dtype=torch.float32).reshape(2048, 1024) + 0.5
    emb[:8] += version
    return {
        "base": torch.arange(4096 * 1024, dtype=torch.float32).reshape(4096, 1024) / 7,
        "emb": emb,
        "head": torch.full((16, 4), float(version)),
        "step": version,
    }


class Holder:
    """A stateful object whose ``state_dict()`` is a dict of DTensors."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state

    def state_dict(self) -> dict[str, Any]:
        return self.state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state = state


def save_incrementally(root: str, epoch: int, mesh: Any) -> None:
    """Save :func:`incremental_state` of ``epoch``'s version with
    ``ckptstore.torch.save`` (incremental: asked for, or, for epoch 2, the location's
    setting); rank 0 then records the bytes of the root's chunk store."""
    state = sharded(incremental_state(VERSIONS[epoch]), mesh)
    location = CheckpointLocation.open(
        root, "zarr", storage_options=OPTIONS, incremental=epoch == 2
    )
    ckptstore.torch.save(
        location, epoch, incremental=None if epoch == 2 else True, state=Holder(state)
    )
    if dist.get_rank() == 0:
        storage = location.storage
        stored = sum(storage.size(key) for key in storage.list_keys(CHUNK_STORE_DIR))
        WORK.joinpath(f"{_name(root)}.chunks.{epoch}").write_text(str(stored))


def loads_version(root: Path | str, epoch: int | None) -> int:
    """Load ``epoch`` of the incremental job (newest if None) on one process (from the
    2 ranks' shards) and check every value; its epoch."""
    reader = Reader(root, epoch, OPTIONS)
    state = {"state": blank(incremental_state(1))}
    dcp.load(state, storage_reader=reader, no_dist=True)
    for key, value in incremental_state(VERSIONS[reader.epoch]).items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(state["state"][key], value), (root, reader.epoch, key)
        else:
            assert state["state"][key] == value, (root, reader.epoch, key)
    return reader.epoch


def cli(*args: str) -> tuple[int, Any]:
    """``ckptstore <args> --json`` with the roots' storage options: exit code, output."""
    options = [f"-o{key}={json.dumps(value)}" for key, value in (OPTIONS or {}).items()]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = ckptstore_main([*args, "--json", *options])
    return code, json.loads(out.getvalue()) if out.getvalue().strip() else None


def incremental(base: str, out: str) -> None:
    """Save epochs 1-3 of :data:`VERSIONS` incrementally on 2 ranks; then (no more
    forks) load each, copy the root (``cp``, ``cp --materialize``), ``ls``, ``verify``,
    and ``gc --keep-last 1``; write what each step found to ``out``."""
    root = f"{base}/incremental"
    for epoch in VERSIONS:
        run_job(root, epoch, "incremental", 0, 0)
    report: dict[str, Any] = {
        "chunk_bytes": [int((WORK / f"incremental.chunks.{e}").read_text()) for e in VERSIONS],
        "intents_left": _storage(root).list_keys(INTENTS_DIR),  # every rank's, once committed
    }
    assert [loads_version(root, epoch) for epoch in VERSIONS] == [1, 2, 3]
    code, listed = cli("ls", root)
    assert code == 0, listed
    report["ls"] = {
        str(entry["epoch"]): [entry["stored_bytes"], entry["shared_bytes"]]
        for run in listed["runs"]
        for entry in run["epochs"]
    }
    report["verify"] = cli("verify", root)[0]
    for flags, name in (([], "copy"), (["--materialize"], "materialized")):
        src = [f"--src-option={k}={json.dumps(v)}" for k, v in (OPTIONS or {}).items()]
        dst = [f"--dst-option={k}={json.dumps(v)}" for k, v in (OPTIONS or {}).items()]
        with contextlib.redirect_stdout(io.StringIO()):
            code = ckptstore_main(["cp", root, f"{base}/{name}", *flags, *src, *dst])
        assert code == 0, (name, code)
        assert [loads_version(f"{base}/{name}", epoch) for epoch in VERSIONS] == [1, 2, 3]
        report[f"{name}_verify"] = cli("verify", f"{base}/{name}")[0]
        report[f"{name}_chunks"] = len(_storage(f"{base}/{name}").list_keys(CHUNK_STORE_DIR))
    code, collected = cli("gc", root, "--keep-last", "1")
    assert code == 0, collected
    report["gc"] = collected
    assert loads_version(root, None) == 3
    for gone in (1, 2):
        try:
            Reader(root, gone, OPTIONS)
            raise AssertionError(f"epoch {gone} is still there after gc --keep-last 1")
        except CheckpointNotFoundError:
            pass
    storage = _storage(root)
    report["chunk_bytes_after_gc"] = sum(
        storage.size(key) for key in storage.list_keys(CHUNK_STORE_DIR)
    )
    report["verify_after_gc"] = cli("verify", root)[0]
    Path(out).write_text(json.dumps(report))


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
    reader = Reader(root, epoch, OPTIONS)
    state = full_target()
    dcp.load(state, storage_reader=reader, no_dist=True)
    expected = full_state(reader.epoch)
    for key, value in expected.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(state[key], value), (root, reader.epoch, key)
        else:
            assert state[key] == value, (root, reader.epoch, key, state[key])
    return reader.epoch


def verified(root: Path | str, newest: int) -> int:
    """Run ``ckptstore verify <root> --json``; check that it agrees with ``Reader``:
    every committed node checkpoint intact (never exit 3), epoch 1 whole, and epoch 2's
    ``dcp`` node committed exactly when ``Reader`` takes epoch 2; any other node of
    epoch 2 stored without its commit is reported (exit 4: partial). Its exit code."""
    code, output = cli("verify", str(root))
    nodes = output["nodes"]
    assert code in (0, 4), (root, code, nodes)
    assert all(n["ok"] and not n["problems"] for n in nodes if n["committed"]), (root, nodes)
    assert {n["node"] for n in nodes if n["epoch"] == 1} == {"dcp", "rank_0", "rank_1"}
    assert all(n["committed"] for n in nodes if n["epoch"] == 1), (root, nodes)
    committed_2 = {n["node"] for n in nodes if n["epoch"] == 2 and n["committed"]}
    assert ("dcp" in committed_2) == (newest == 2), (root, nodes)
    assert (code == 0) == all(n["committed"] for n in nodes), (root, nodes)
    return code


def check(root: Path | str) -> dict[str, Any]:
    newest = loads_exactly(root, None)
    assert loads_exactly(root, 1) == 1
    storage = _storage(root)
    if newest == 1:
        try:
            Reader(root, epoch=2, storage_options=OPTIONS)
            raise AssertionError(f"{root}: Reader accepts epoch 2 but not as the newest")
        except CheckpointNotFoundError:
            pass
        assert "dcp" not in committed_nodes(storage, 2)
    return {"newest": newest, "verify": verified(root, newest)}


def kill_points(points: str, rank: int, calls: int) -> list[int]:
    """The calls of ``rank`` (of ``calls``) to kill it at: ``points`` is N (every N-th
    and the last) or ``<rank>:<K>,...`` (K < 0: the -K-th from the last)."""
    if points.isdigit():
        return sorted({*range(1, calls + 1, int(points)), calls})
    chosen = [tuple(map(int, point.split(":"))) for point in points.split(",")]
    return sorted({k if k > 0 else calls + 1 + k for r, k in chosen if r == rank})


def matrix(base: str, pairs: list[tuple[int, int]], out: str) -> None:
    """Save with N ranks under ``<base>/saved-by-<N>``, load on M, for each ``N:M``
    pair (each save once)."""
    for saving in sorted({n for n, _ in pairs}):
        run_job(f"{base}/saved-by-{saving}", 1, "save", 0, 0, world=saving)
    for saving, loading in pairs:
        run_job(f"{base}/saved-by-{saving}", 1, "load", 0, 0, world=loading)
    Path(out).write_text(json.dumps({"pairs": pairs}))


def main() -> None:
    global WORK, OPTIONS
    get_registry()  # the plugins, found once here rather than in every fork
    WORK = Path(sys.argv[1])
    if sys.argv[2] == "matrix":
        pairs = [tuple(map(int, pair.split(":"))) for pair in sys.argv[3].split(",")]
        base = sys.argv[5] if len(sys.argv) > 5 else sys.argv[1]
        OPTIONS = json.loads(sys.argv[6]) if len(sys.argv) > 6 else None
        matrix(base, pairs, sys.argv[4])  # type: ignore[arg-type]
        return
    if sys.argv[2] == "incremental":
        OPTIONS = json.loads(sys.argv[5]) if len(sys.argv) > 5 else None
        incremental(sys.argv[4] if len(sys.argv) > 4 else sys.argv[1], sys.argv[3])
        return
    work, mode, points, out = WORK, sys.argv[2], sys.argv[3], sys.argv[4]
    base = sys.argv[5] if len(sys.argv) > 5 else str(work)
    OPTIONS = json.loads(sys.argv[6]) if len(sys.argv) > 6 else None
    # on local disk each job starts from a copy of a template; on an object store,
    # where a copy costs as much as a save, each job saves epoch 1 itself, then 2
    local = "://" not in base
    template = f"{base}/template"
    if local:
        run_job(template, 1, "save", 0, 0)
    counting = f"{base}/counting"
    if local:
        shutil.copytree(template, counting)
    run_job(counting, 2, mode, 0, 0)
    calls = [int((work / f"counting.calls.{rank}").read_text()) for rank in range(WORLD)]
    trials = []
    for rank in range(WORLD):
        for kill_at in kill_points(points, rank, calls[rank]):
            root = f"{base}/{mode}-{rank}-{kill_at}"
            if local:
                shutil.copytree(template, root)
            killed = run_job(root, 2, mode, rank, kill_at)
            trials.append({"rank": rank, "kill_at": kill_at, "killed": killed, "root": root})
    for trial in trials:  # only now: this process reads (with threads) after its last fork
        trial.update(check(trial["root"]))
    assert check(counting) == {"newest": 2, "verify": 0}
    Path(out).write_text(json.dumps({"calls": calls, "trials": trials}))


if __name__ == "__main__":
    main()
