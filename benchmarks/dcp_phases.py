"""Where a ``dcp.save`` on 2 ranks spends its time, per rank and phase, for ckptstore's
``Writer`` and DCP's own storages (the breakdown behind docs/benchmarks.md, "torch
DCP on 2 ranks").

    python -m benchmarks.dcp_phases --workload gpt2-adam-narrow           # local disk
    python -m benchmarks.dcp_phases --workload gpt2-adam-narrow --s3      # moto +20 ms
    python -m benchmarks.dcp_phases --workload mixed-1g --loads --repeat 8  # loads' floor

Each rank times DCP's steps by wrapping them (in the forked ranks only): the planner's
``set_up_planner`` + ``create_local_plan`` and, on the coordinator,
``create_global_plan``; the storage's ``prepare_local_plan``, ``prepare_global_plan``,
``write_data`` until its future resolves (the planner's ``resolve_data`` inside it
shown apart) and ``finish``; DCP's collectives (``gather_object``, ``scatter_object``,
``broadcast_object``: the wire, pickling the plans and waiting for the other rank);
"other" is the rest of ``dcp.save``. A third storage stores nothing (its ``write_data``
returns at once): its saves are DCP's own cost alone. The common part is what both storages spend
outside the storage methods. Medians of ``--repeat`` saves; the storages' saves
alternate in one job, so they see the same load.

``--loads``: the same for 2 -> 2 loads on disk, in whole jobs: ckptstore's ``Reader``,
:class:`NullReader` (DCP's own cost: it plans and reads the metadata, but no data) and
DCP's ``FileSystemReader`` (of a save with ``--threads`` writer threads), alternating,
each value printed beside the medians.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import wraps
from pathlib import Path
from typing import Any

import numpy as np
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, SavePlan, SavePlanner
from torch.distributed.checkpoint.storage import StorageWriter, WriteResult
from torch.distributed.checkpoint.utils import _DistWrapper
from torch.distributed.device_mesh import init_device_mesh
from torch.futures import Future

from benchmarks import dcp as bench
from benchmarks import s3_ceiling
from benchmarks.system import memory_kept
from ckptstore.plugin import get_registry
from ckptstore.torch.dcp import Reader

PHASES = (
    "local plan (planner)",
    "prepare_local_plan",
    "global plan (planner)",
    "prepare_global_plan",
    "collectives",
    "finish_plan (planner)",
    "write_data",
    "  of which resolve_data",
    "finish",
    "other",
)
ENDPOINT: list[str] = []
"""The moto endpoint of an ``--s3`` run."""
STORAGE = ("prepare_local_plan", "prepare_global_plan", "write_data", "finish")


class NullWriter(StorageWriter):
    """A storage that stores nothing: a save through it is DCP's own cost alone."""

    def reset(self, checkpoint_id: Any = None) -> None:
        pass

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        pass

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return plans

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        future: Future[list[WriteResult]] = Future()
        future.set_result(
            [
                WriteResult(index=item.index, size_in_bytes=0, storage_data=None)
                for item in plan.items
            ]
        )
        return future

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        pass

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return False


class NullReader(Reader):
    """ckptstore's ``Reader`` that reads no data: a load through it is DCP's own cost
    (its planner and collectives, and the metadata) alone."""

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        done: Future[None] = Future()
        done.set_result(None)
        return done


class NullStorage(bench.Storage):
    """Stores nothing; loads, from ckptstore's checkpoint at ``root``, read nothing."""

    def writer(self, epoch: int) -> Any:
        return NullWriter()

    def reader(self, epoch: int) -> Any:
        return NullReader(self.root, epoch)


def load_lines(args: argparse.Namespace, work: Path) -> list[str]:
    """``--loads``: 2 -> 2 loads on disk through ckptstore's ``Reader``, one that reads
    nothing, and DCP's ``FileSystemReader``, alternating (caches dropped before each)."""
    disk = work / "loads"
    ours = bench.Storage("ckptstore Reader", "ckptstore", str(disk / "ours"))
    theirs = bench.Storage(
        f"DCP FileSystemReader ({args.threads} writer threads)",
        "fs",
        str(disk / "fs"),
        threads=args.threads,
    )
    null = NullStorage("a reader that reads nothing (DCP's own cost)", "null", ours.root)
    for storage in (ours, theirs):
        bench.run_job(storage, 2, [["save", 1]], work)
    storages = [ours, null, theirs]
    times: dict[str, list[float]] = {storage.name: [] for storage in storages}
    for round_ in range(args.repeat):
        for storage in storages if round_ % 2 == 0 else storages[::-1]:
            [result] = bench.run_job(storage, 2, [["load", 1]], work)
            times[storage.name].append(result["seconds"])
    return [
        f"* {name}: median {statistics.median(seconds):.2f} s "
        f"({', '.join(f'{s:.2f}' for s in seconds)})"
        for name, seconds in times.items()
    ]


class Clock:
    """Seconds spent per phase in the current save."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}

    def add(self, phase: str, seconds: float) -> None:
        self.spent[phase] = self.spent.get(phase, 0.0) + seconds

    def wrap(self, owner: Any, name: str, phase: str, resolve: bool = False) -> None:
        """Time ``owner.name`` as ``phase`` (``resolve``: wait for the future it returns)."""
        original = getattr(owner, name)

        @wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            result = original(*args, **kwargs)
            if resolve:
                result.wait()
            self.add(phase, time.perf_counter() - started)
            return result

        setattr(owner, name, timed)


def instrument(clock: Clock, writer_types: list[type]) -> None:
    """Wrap DCP's planner, collectives and each storage writer type's methods."""
    planner = DefaultSavePlanner
    clock.wrap(planner, "set_up_planner", "local plan (planner)")
    clock.wrap(planner, "create_local_plan", "local plan (planner)")
    clock.wrap(planner, "create_global_plan", "global plan (planner)")
    clock.wrap(planner, "finish_plan", "finish_plan (planner)")
    clock.wrap(planner, "resolve_data", "  of which resolve_data")
    for name in ("gather_object", "scatter_object", "broadcast_object"):
        clock.wrap(_DistWrapper, name, "collectives")
    for kind in writer_types:
        for name in STORAGE:
            clock.wrap(kind, name, name, resolve=name == "write_data")


def rank_main(rank: int, world: int, port: int, storages: list[Any], repeat: int, out: str) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    mesh = init_device_mesh("cpu", (world,))
    clock = Clock()
    writers = [type(storage.writer(10_000 + n)) for n, storage in enumerate(storages)]
    instrument(clock, list(dict.fromkeys(writers)))
    results: list[dict[str, Any]] = []
    for epoch in range(1, repeat + 1):
        for which, storage in enumerate(storages):
            state = bench.sharded(mesh, empty=False)
            writer = storage.writer(epoch)
            clock.spent = {}
            dist.barrier()
            started = time.perf_counter()
            dcp.save(state, storage_writer=writer)
            total = time.perf_counter() - started
            dist.barrier()
            spent = dict(clock.spent)
            inside = sum(v for k, v in spent.items() if not k.startswith("  "))
            spent["other"] = total - inside
            spent["total"] = total
            results.append({"which": which, "spent": spent})
    Path(f"{out}.{rank}").write_text(json.dumps(results))
    dist.destroy_process_group()


def run(storages: list[Any], repeat: int, work: Path) -> dict[int, dict[int, dict[str, float]]]:
    """Per storage, per rank: the median seconds of each phase."""
    out = str(work / f"phases-{time.monotonic_ns()}")
    bench.run_ranks(rank_main, 2, (bench.free_port(), storages, repeat, out), "phases")
    medians: dict[int, dict[int, dict[str, float]]] = {}
    for rank in range(2):
        results = json.loads(Path(f"{out}.{rank}").read_text())
        for which in range(len(storages)):
            saves = [r["spent"] for r in results if r["which"] == which]
            keys = {key for spent in saves for key in spent}
            medians.setdefault(which, {})[rank] = {
                key: statistics.median(spent.get(key, 0.0) for spent in saves) for key in keys
            }
    return medians


def table(names: list[str], medians: dict[int, dict[int, dict[str, float]]]) -> list[str]:
    header = "| phase (s) | " + " | ".join(
        f"{name}, rank {rank}" for name in names for rank in (0, 1)
    )
    lines = [header + " |", "|---" + "|---:" * (2 * len(names)) + "|"]
    for phase in (*PHASES, "total"):
        cells = [
            f"{medians[n][rank].get(phase, 0.0):.3f}" for n in range(len(names)) for rank in (0, 1)
        ]
        lines.append(f"| {phase.strip()} | " + " | ".join(cells) + " |")
    for n, name in enumerate(names):
        for rank in (0, 1):
            spent = medians[n][rank]
            common = spent["total"] - sum(spent.get(key, 0.0) for key in STORAGE)
            lines.append(
                f"* {name}, rank {rank}: outside the storage methods {common:.3f} s "
                f"of {spent['total']:.3f} s ({common / spent['total']:.0%})"
            )
    return lines


@contextmanager
def storages_for(args: argparse.Namespace, work: Path) -> Iterator[list[Any]]:
    if not args.s3:
        disk = work / "disk"
        yield [
            bench.Storage("ckptstore", "ckptstore", str(disk / "ours")),
            bench.Storage(
                f"DCP fs, {args.threads} thr", "fs", str(disk / "fs"), threads=args.threads
            ),
            NullStorage("no storage", "null", ""),
        ]
        return
    with bench.moto(args.latency_ms) as endpoint:
        options = bench.s3_options(endpoint)
        ENDPOINT[:] = [endpoint]
        yield [
            bench.Storage("ckptstore", "ckptstore", "s3://bench/ours", options),
            bench.Storage(
                f"DCP fsspec, {args.threads} thr",
                "fsspec",
                "s3://bench/fsspec",
                options,
                args.threads,
            ),
            NullStorage("no storage", "null", ""),
        ]


def _ceiling_rank(
    rank: int, world: int, endpoint: str, nbytes: int, start: Any, out: str, repeat: int
) -> None:
    """One rank's share of the ceiling: ``nbytes`` PUT as K objects at once, then read
    back as K GETs at once, for K in 1, 2, 4, 8, every rank together."""
    client = s3_ceiling._Client(endpoint, "bench")
    data = memoryview(np.random.default_rng(rank).bytes(nbytes))
    target = memoryview(bytearray(nbytes))
    times: dict[str, list[float]] = {}
    for _ in range(repeat):
        for parallel in (1, 2, 4, 8):
            parts = s3_ceiling._parts(nbytes, parallel)
            keys = [f"ceiling/{rank}/{n}" for n in range(len(parts))]

            def put(n: int, parts: Any = parts, keys: list[str] = keys) -> None:
                at, size = parts[n]
                client.request("PUT", keys[n], body=data[at : at + size])

            def get(n: int, parts: Any = parts, keys: list[str] = keys) -> None:
                at, size = parts[n]
                client.request("GET", keys[n], into=target[at : at + size])

            for kind, call in (("PUT", put), ("GET", get)):
                start.wait()
                started = time.perf_counter()
                with ThreadPoolExecutor(parallel) as pool:
                    list(pool.map(call, range(len(parts))))
                times.setdefault(f"{kind} {parallel}", []).append(time.perf_counter() - started)
    Path(f"{out}.{rank}").write_text(json.dumps(times))


def ceiling(endpoint: str, nbytes: int, work: Path, repeat: int) -> dict[str, float]:
    """moto's best time for 2 ranks each storing (and reading back) ``nbytes`` at once,
    with a bare HTTP client (:mod:`benchmarks.s3_ceiling`): per way, the best of
    ``repeat`` of the slowest rank."""
    out = str(work / f"ceiling-{time.monotonic_ns()}")
    start = multiprocessing.get_context("fork").Barrier(2)
    bench.run_ranks(_ceiling_rank, 2, (endpoint, nbytes, start, out, repeat), "ceiling")
    ranks = [json.loads(Path(f"{out}.{rank}").read_text()) for rank in range(2)]
    return {way: min(map(max, zip(*(r[way] for r in ranks), strict=True))) for way in ranks[0]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="gpt2-adam-narrow")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=4, help="DCP's writer threads")
    parser.add_argument("--s3", action="store_true", help="moto +latency instead of disk")
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--directory", type=Path, default=None)
    parser.add_argument(
        "--loads", action="store_true", help="2 -> 2 loads on disk against DCP's own cost"
    )
    parser.add_argument(
        "--only", default="", help="comma-separated names of the storages to run (for profiling)"
    )
    args = parser.parse_args(argv)
    bench.BLOBS.clear()
    bench.BLOBS.update(bench.make_workload(args.workload))
    get_registry()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load = os.getloadavg()[0]
    if args.loads:
        with memory_kept() as memory, tempfile.TemporaryDirectory(dir=args.directory) as work:
            lines = load_lines(args, Path(work))
        print(f"{args.workload}, 2 -> 2 loads on local disk, {started}, load {load:.1f}")
        print("\n".join([memory, *lines] if memory else lines))
        return 0
    with (
        memory_kept() as memory,
        tempfile.TemporaryDirectory(dir=args.directory) as directory,
        storages_for(args, Path(directory)) as every,
    ):
        chosen = set(filter(None, args.only.split(",")))
        storages = [s for s in every if not chosen or s.kind in chosen]
        medians = run(storages, args.repeat, Path(directory))
        if args.s3:
            size = sum(array.nbytes for array in bench.BLOBS.values()) // 2
            best = ceiling(ENDPOINT[0], size, Path(directory), args.repeat)
    where = f"moto +{args.latency_ms:g} ms" if args.s3 else "local disk"
    print(f"{args.workload} on {where}, {started}, load {load:.1f}, medians of {args.repeat}")
    if memory:
        print(memory)
    print("\n".join(table([s.name for s in storages], medians)))
    if args.s3:
        print(
            f"* moto's ceiling, 2 ranks each storing {size / (1 << 20):.0f} MiB at once "
            "(bare HTTP, K objects in parallel; best of the slowest rank): "
            + ", ".join(f"{way}: {seconds:.2f} s" for way, seconds in best.items())
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
