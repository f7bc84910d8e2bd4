"""ckptstore as the storage of torch DCP, against DCP's own storages, on 2 ranks.

    python -m benchmarks.dcp              # 1 GiB mix and GPT-2-small + Adam, disk and moto
    python -m benchmarks.dcp --smoke      # tiny state, loopback moto, seconds (CI)
    python -m benchmarks.dcp --docs       # also update docs/benchmarks-tables.md
    python -m benchmarks.dcp --workloads mixed-256m,gpt2-adam-narrow   # ~0.2 GiB each

Every rank holds DTensor shards (``Shard(0)``) of every blob of the workload (the
``mixed-1g`` mix of :mod:`benchmarks.workload`, or ``gpt2-adam``: GPT-2 small's
parameters and Adam moments); a gloo job of 2 forked ranks saves them with
``dcp.save``, and jobs of 2, 1 and 4 ranks load them (same topology, 2 -> 1, 2 -> 4);
a job of 4 ranks saves and loads them (4 -> 4), and one of 2 loads that (4 -> 2).
Storages: ckptstore's ``Writer`` / ``Reader`` against DCP's ``FileSystemWriter`` /
``FileSystemReader`` on local disk (the writer's ``thread_count`` swept over 1, 2, 4, 8
and the fastest median save used, named in the table), and against DCP's
``FsspecWriter`` / ``FsspecReader`` (s3fs) on a moto S3 server with +20 ms per request
(the network namespace of :mod:`benchmarks.object_store`), keeping its objects in memory
(``--moto-on-disk``: in temporary files on this disk, moto's default), each storage's
older epochs deleted after each save so that moto holds at most two. There, each
storage's writer settings are swept and its fastest used, named in the table: DCP's
thread count (1, 2, 4, 8) with s3fs's default 50 MiB blocks or whole files, and
ckptstore's default or whole objects (:data:`WHOLE_OBJECTS`). A time is the slowest rank's,
between barriers; page caches are dropped before each disk load when allowed (root).
``dcp.async_save``: the time the call blocks the training loop (staging), and in total.
Bytes read are the loading ranks' ``rchar`` (every byte a read syscall returned, disk
or socket) against the bytes of the shards they load. Medians of ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import shutil
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
import torch._dynamo  # DTensor's first use imports it: once here, not in every fork
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from fsspec.core import url_to_fs
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

from benchmarks.measure import _rchar
from benchmarks.network import NetworkNamespace
from benchmarks.object_store import delayed_server, loopback_server, moto_storage
from benchmarks.report import publish
from benchmarks.system import drop_caches, memory_kept
from benchmarks.workload import make_workload
from ckptstore.checkpoint import KeepLast, carry_out, plan_retention
from ckptstore.plugin import get_registry
from ckptstore.protocol import CheckpointLocation, storage_of
from ckptstore.torch.dcp import Reader, Writer

GiB = float(1 << 30)
T = TypeVar("T")
WHOLE_OBJECTS = 5 << 30
"""S3's largest single PUT. As ckptstore's ``multipart_threshold`` or s3fs's
``default_block_size``, it makes each storage send every object whole, in one PUT:
moto joins the parts of a multipart upload by copying them, on this machine's cores
(a 77 MiB object: 1.1 s), which real S3 does on its own."""
KEY, SECRET = "bench", "bench-secret"
BLOBS: dict[str, np.ndarray[Any, Any]] = {}
"""The workload, made before the ranks fork (they inherit it, copy-on-write)."""


@dataclass
class Storage:
    """One storage under test: how each rank makes its writer and reader."""

    name: str
    kind: str  # ckptstore, fs, fsspec
    root: str
    options: dict[str, Any] = field(default_factory=dict)
    threads: int = 1
    write_options: dict[str, Any] = field(default_factory=dict)
    """Options of the writer only (how it uploads), beside ``options``."""

    def writer(self, epoch: int) -> Any:
        options = {**self.options, **self.write_options}
        if self.kind == "ckptstore":
            return Writer(self.root, epoch=epoch, storage_options=options or None)
        if self.kind == "fs":
            return dcp.FileSystemWriter(
                f"{self.root}/e{epoch}", thread_count=self.threads, sync_files=True
            )
        return FsspecWriter(f"{self.root}/e{epoch}", thread_count=self.threads, **options)

    def reader(self, epoch: int) -> Any:
        if self.kind == "ckptstore":
            return Reader(self.root, epoch, storage_options=self.options or None)
        if self.kind == "fs":
            return dcp.FileSystemReader(f"{self.root}/e{epoch}")
        return FsspecReader(f"{self.root}/e{epoch}", **self.options)

    @property
    def remote(self) -> bool:
        """Whether the root is on moto (a URL), not on this disk."""
        return "://" in self.root

    def clear(self) -> None:
        """Delete everything saved under the root."""
        if not self.remote:
            shutil.rmtree(self.root, ignore_errors=True)
            return
        fs, root = url_to_fs(self.root, **self.options)
        fs.invalidate_cache(root)
        fs.rm(root, recursive=True)

    def keep_only(self, epoch: int) -> None:
        """Delete every saved epoch but ``epoch``, the newest (ckptstore: its own
        retention, what ``ckptstore gc --keep-last 1`` does)."""
        if self.kind == "ckptstore":
            location = CheckpointLocation.open(self.root, "zarr", storage_options=self.options)
            storage = storage_of(location)
            carry_out(storage, plan_retention(storage, KeepLast(1)))
            return
        fs, root = url_to_fs(self.root, **self.options)
        fs.invalidate_cache(root)  # the listing as it is now, not as cached before the save
        for path in fs.ls(root, detail=False):
            if path.rstrip("/").rsplit("/", 1)[-1] != f"e{epoch}":
                fs.rm(path, recursive=True)


def sharded(mesh: Any, empty: bool) -> dict[str, Any]:
    """This rank's DTensor shards of every blob (zeros to load into when ``empty``);
    each rank cuts its own shard, nothing is sent. The zeros are written before a load
    is timed, as a training job's model exists before it restores."""
    state = {}
    for name, array in BLOBS.items():
        full = torch.from_numpy(array)
        if empty:
            full = torch.empty_like(full)
        state[name] = distribute_tensor(full, mesh, [Shard(0)], src_data_rank=None)
        if empty:
            state[name].to_local().zero_()
    return state


def local_bytes(state: dict[str, Any]) -> int:
    return sum(value.to_local().nbytes for value in state.values())


def timed(operation: Callable[[], Any]) -> float:
    dist.barrier()
    started = time.perf_counter()
    operation()
    dist.barrier()
    return time.perf_counter() - started


def async_save(state: dict[str, Any], writer: Any, blocked: list[float]) -> None:
    """``dcp.async_save``, noting how long the call blocked, then its wait."""
    started = time.perf_counter()
    future = dcp.async_save(state, storage_writer=writer)
    blocked.append(time.perf_counter() - started)
    future.result()


def rank_main(
    rank: int, world: int, port: int, storages: list[Storage], plan: list[Any], out: str
) -> None:
    """Run ``plan`` (``[op, epoch]`` pairs: save, async, load, keep; ``[op, epoch,
    which]``: on ``storages[which]``, else the first) on this rank; append one result per
    operation but keep (every epoch but this one deleted) to ``out.<rank>``."""
    os.environ["OMP_NUM_THREADS"] = "1"
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    mesh = init_device_mesh("cpu", (world,))
    results = []
    for op, epoch, *chosen in plan:
        which = chosen[0] if chosen else 0
        storage = storages[which]
        if op == "save":
            state = sharded(mesh, empty=False)
            save = partial(dcp.save, state, storage_writer=storage.writer(epoch))
            results.append({"op": op, "seconds": timed(save), "which": which})
        elif op == "async":
            state = sharded(mesh, empty=False)
            blocked: list[float] = []
            save = partial(async_save, state, storage.writer(epoch), blocked)
            results.append(
                {"op": op, "seconds": timed(save), "blocked": blocked[0], "which": which}
            )
        elif op == "keep":  # untimed, no result
            if rank == 0:
                storage.keep_only(epoch)
            dist.barrier()
        else:
            state = sharded(mesh, empty=True)
            load = partial(dcp.load, state, storage_reader=storage.reader(epoch))
            if rank == 0:
                drop_caches()
            before = _rchar()
            seconds = timed(load)
            read = _rchar() - before
            needed = local_bytes(state)
            results.append(
                {"op": op, "seconds": seconds, "read": read, "needed": needed, "which": which}
            )
    Path(f"{out}.{rank}").write_text(json.dumps(results))
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run_ranks(target: Callable[..., None], world: int, args: tuple[Any, ...], name: str) -> None:
    """``target(rank, world, *args)`` in ``world`` forked processes; raise if one fails."""
    context = multiprocessing.get_context("fork")
    ranks = [context.Process(target=target, args=(rank, world, *args)) for rank in range(world)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join()
    if any(process.exitcode != 0 for process in ranks):
        raise SystemExit(f"{name}: a rank failed ({[p.exitcode for p in ranks]})")


def run_job(
    storage: Storage | list[Storage], world: int, plan: list[Any], work: Path
) -> list[dict[str, Any]]:
    """One job of ``world`` forked ranks (``plan``: see :func:`rank_main`); per
    operation: the slowest rank's times, the ranks' bytes read and needed summed."""
    storages = storage if isinstance(storage, list) else [storage]
    out = str(work / f"job-{time.monotonic_ns()}")
    run_ranks(rank_main, world, (free_port(), storages, plan, out), storages[0].name)
    per_rank = [json.loads(Path(f"{out}.{rank}").read_text()) for rank in range(world)]
    merged = []
    for entries in zip(*per_rank, strict=True):
        result: dict[str, Any] = {"op": entries[0]["op"], "which": entries[0]["which"]}
        for key in ("seconds", "blocked"):
            if key in entries[0]:
                result[key] = max(entry[key] for entry in entries)
        for key in ("read", "needed"):
            if key in entries[0]:
                result[key] = sum(entry[key] for entry in entries)
        merged.append(result)
    return merged


@dataclass
class Row:
    storage: str
    save: list[float] = field(default_factory=list)
    blocked: list[float] = field(default_factory=list)
    async_total: list[float] = field(default_factory=list)
    loads: dict[str, list[float]] = field(default_factory=dict)
    """Load times by topology: ``"2>2"``, ``"2>1"``, ``"2>4"`` (saved by 2 ranks),
    ``"4>4"``, ``"4>2"`` (saved by 4)."""
    read: dict[str, float] = field(default_factory=dict)


def measure_storage(
    storage: Storage, repeat: int, work: Path, *, reshard: bool = True, four: bool = True
) -> Row:
    """Saves (and async saves) on 2 ranks, then loads on 2, and on 1 and 4 ranks; a save
    on 4 ranks loaded on 4 and on 2 (unless not ``four``)."""
    (row,) = measure_paired([storage], repeat, work)
    if not reshard:
        return row
    jobs = [(1, 1, "2>1"), (4, 1, "2>4"), (4, 201, "4>4"), (2, 201, "4>2")][: 4 if four else 2]
    for world, epoch, topology in jobs:
        plan = [["save", epoch]] if topology == "4>4" else []
        for result in run_job(storage, world, plan + [["load", epoch]] * repeat, work):
            if result["op"] == "load":
                row.loads.setdefault(topology, []).append(result["seconds"])
                row.read[topology] = result["read"] / result["needed"]
    return row


def measure_paired(
    storages: list[Storage], repeat: int, work: Path, *, keep_one: bool = False
) -> list[Row]:
    """Saves, async saves and loads on 2 ranks of every storage, in one job, each
    operation on every storage back to back (their ratios see the same load).
    ``keep_one``: after each save, every older epoch is deleted (untimed; a moto keeping
    its objects in memory would hold every repeat's), and the loads read the newest."""
    rows = [Row(storage.name) for storage in storages]
    which = range(len(storages))
    saves = [["save", epoch, n] for epoch in range(1, repeat + 1) for n in which]
    saves += [["async", epoch, n] for epoch in range(101, 101 + repeat) for n in which]
    plan = []
    for save in saves:
        plan += [save, ["keep", *save[1:]]] if keep_one else [save]
    loaded = 100 + repeat if keep_one else 1
    plan += [["load", loaded, n] for _ in range(repeat) for n in which]
    for result in run_job(storages, 2, plan, work):
        row, storage = rows[result["which"]], storages[result["which"]]
        if result["op"] == "save":
            row.save.append(result["seconds"])
        elif result["op"] == "async":
            row.blocked.append(result["blocked"])
            row.async_total.append(result["seconds"])
        else:
            row.loads.setdefault("2>2", []).append(result["seconds"])
            if not storage.remote:  # rchar misses socket recv(): disk only
                row.read["2>2"] = result["read"] / result["needed"]
    return rows


def fastest(
    make: Callable[[T], Storage], choices: list[T], repeat: int, work: Path
) -> tuple[T, dict[str, float]]:
    """The writer setting (a thread count, say) with the fastest median save (2 ranks),
    and each setting's median by its storage's name; on an object store, each older
    epoch deleted after each save (untimed), and the last at the end."""
    medians: dict[T, float] = {}
    swept: dict[str, float] = {}
    for choice in choices:
        storage = make(choice)
        plan: list[Any] = []
        for epoch in range(1, repeat + 1):
            plan += [["save", epoch], ["keep", epoch]] if storage.remote else [["save", epoch]]
        medians[choice] = statistics.median(r["seconds"] for r in run_job(storage, 2, plan, work))
        swept[storage.name] = medians[choice]
        storage.clear()
        print(f"  {storage.name}: save {medians[choice]:.2f} s", flush=True)
    return min(medians, key=medians.__getitem__), swept


def sweep_lines(swept: dict[str, float]) -> list[str]:
    """The report's line of the settings swept (none if nothing was)."""
    if not swept:
        return []
    return [
        "* settings swept (median save s): " + "; ".join(f"{n}: {s:.2f}" for n, s in swept.items())
    ]


TOPOLOGIES = ("2>2", "2>1", "2>4", "4>4", "4>2")


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def table(rows: list[Row], size: int) -> list[str]:
    ours = rows[0]
    lines = [
        "| storage | save s | async blocked s | async total s | load 2->2 s "
        "| load 2->1 s | load 2->4 s | load 4->4 s | load 4->2 s "
        "| read/needed 2->2, 2->1, 2->4, 4->4, 4->2 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        loads = [median(row.loads.get(topology, [])) for topology in TOPOLOGIES]
        reads = ", ".join(f"{row.read[t]:.2f}" if t in row.read else "-" for t in TOPOLOGIES)
        lines.append(
            f"| {row.storage} | {median(row.save):.2f} | {median(row.blocked):.2f} "
            f"| {median(row.async_total):.2f} | "
            + " | ".join(f"{value:.2f}" for value in loads)
            + f" | {reads} |"
        )
    lines.append("")
    for row in rows[1:]:
        save = median(row.save) / median(ours.save)
        load = median(row.loads["2>2"]) / median(ours.loads["2>2"])
        lines.append(
            f"* against {row.storage}: ckptstore saves {save:.2f}x as fast, loads "
            f"(2 -> 2) {load:.2f}x as fast; async_save blocks {median(ours.blocked):.2f} s "
            f"against {median(row.blocked):.2f} s"
        )
    for topology in ("2>1", "2>4", "4>2"):
        if topology in ours.loads:
            same = median(ours.loads[f"{topology[0]}>{topology[0]}"])
            lines.append(
                f"* ckptstore resharded load {topology.replace('>', ' -> ')}: "
                f"{median(ours.loads[topology]) / same:.2f}x the time of the "
                f"{topology[0]} -> {topology[0]} load, reading {ours.read[topology]:.2f}x "
                "the bytes needed"
            )
    lines.append(f"* state: {size / GiB:.3f} GiB over 2 ranks")
    return lines


@contextmanager
def moto(latency_ms: float | None, in_memory: bool = False) -> Iterator[str]:
    """A moto server's endpoint: on loopback (``latency_ms`` None) or in a network
    namespace with that latency; ``in_memory``: it writes no object to disk."""
    if latency_ms is None:
        with loopback_server(in_memory=in_memory) as endpoint:
            yield endpoint
        return
    port = 9600 + os.getpid() % 300
    with (
        NetworkNamespace("ckptdcp", delay_ms=latency_ms) as network,
        delayed_server(network, latency_ms, port, in_memory=in_memory) as endpoint,
    ):
        yield endpoint


def s3_options(endpoint: str) -> dict[str, Any]:
    return {
        "endpoint_url": endpoint,
        "key": KEY,
        "secret": SECRET,
        "client_kwargs": {"region_name": "us-east-1"},
    }


def run_workload(workload: str, args: argparse.Namespace, work: Path) -> list[str]:
    BLOBS.clear()
    BLOBS.update(make_workload(workload))
    size = sum(array.nbytes for array in BLOBS.values())
    print(f"{workload}: {len(BLOBS)} blobs, {size / GiB:.3f} GiB", flush=True)
    if args.only_s3:
        return s3_lines(workload, args, size, work)
    disk = work / "disk"
    counts = [2] if args.smoke else [1, 2, 4, 8]  # smoke: no sweep, one job less
    if args.threads or args.smoke:
        best, sweep = args.threads or 2, {}
    else:
        best, sweep = fastest(
            lambda n: Storage(
                f"DCP FileSystemWriter, {n} threads", "fs", str(disk / f"fs{n}"), threads=n
            ),
            counts,
            args.repeat,
            work,
        )
    rows = [
        measure_storage(
            Storage("ckptstore Writer/Reader", "ckptstore", str(disk / "ours")),
            args.repeat,
            work,
            four=not args.smoke,
        ),
        measure_storage(
            Storage(
                f"DCP FileSystemWriter/Reader, {best} threads", "fs", str(disk / "fs"), threads=best
            ),
            args.repeat,
            work,
            reshard=not args.smoke,
        ),
    ]
    for row in rows:
        print(
            f"  {row.storage}: save {median(row.save):.2f} s, "
            f"load {median(row.loads['2>2']):.2f} s",
            flush=True,
        )
    shutil.rmtree(disk, ignore_errors=True)
    lines = [f"#### {workload} on local disk ({size / GiB:.2f} GiB, 2 ranks)", ""]
    lines += table(rows, size) + sweep_lines(sweep)
    if args.no_s3:
        return lines
    return lines + s3_lines(workload, args, size, work)


def s3_lines(workload: str, args: argparse.Namespace, size: int, work: Path) -> list[str]:
    """The moto rows: ckptstore and DCP's fsspec storage, each at its fastest writer
    settings on this moto (``--threads``, or smoke: DCP at that thread count, both
    storages at their defaults): ckptstore's default ``multipart_threshold`` or whole
    objects; DCP's thread count, with s3fs's default blocks or whole files."""
    latency = None if args.smoke else args.latency_ms
    in_memory = not args.moto_on_disk
    with moto(latency, in_memory) as endpoint:
        options = s3_options(endpoint)

        def ours(whole: bool) -> Storage:
            extra = {"multipart_threshold": WHOLE_OBJECTS} if whole else {}
            label = ", whole objects" if whole else ""
            root = f"s3://bench/ours{'-whole' if whole else ''}"
            return Storage(f"ckptstore Writer/Reader{label}", "ckptstore", root, options, 1, extra)

        def theirs(setting: tuple[int, bool]) -> Storage:
            threads, whole = setting
            extra = {"default_block_size": WHOLE_OBJECTS} if whole else {}
            label = ", whole files" if whole else ""
            return Storage(
                f"DCP FsspecWriter/Reader (s3fs), {threads} threads{label}",
                "fsspec",
                f"s3://bench/fsspec-{threads}{'-whole' if whole else ''}",
                options,
                threads,
                extra,
            )

        if args.threads or args.smoke:
            best, sweep = (args.threads or 2, False), {}
            whole, own_sweep = False, {}
        else:
            settings = [(n, whole) for whole in (False, True) for n in (1, 2, 4, 8)]
            best, sweep = fastest(theirs, settings, args.repeat, work)
            whole, own_sweep = fastest(ours, [False, True], args.repeat, work)
        storages = [ours(whole), theirs(best)]
        s3_rows = measure_paired(storages, args.repeat, work, keep_one=in_memory)
    label = "loopback" if latency is None else f"+{latency:g} ms per request"
    label += f", {moto_storage(in_memory)}"
    lines = ["", f"#### {workload} on moto S3, {label} (2 ranks)", ""]
    return lines + table(s3_rows, size) + sweep_lines({**sweep, **own_sweep})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny state, loopback moto")
    parser.add_argument("--docs", action="store_true", help="update docs/benchmarks-tables.md")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--no-s3", action="store_true", help="local disk only")
    parser.add_argument("--only-s3", action="store_true", help="moto only (no disk rows)")
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="DCP's writer threads (default: the fastest of 1, 2, 4, 8 on each storage)",
    )
    parser.add_argument(
        "--moto-on-disk",
        action="store_true",
        help="let moto keep objects over 5 MiB in temporary files on this disk (its "
        "default; the runs before 2026-11-29), and every epoch saved",
    )
    parser.add_argument("--workloads", default="mixed-1g,gpt2-adam")
    parser.add_argument("--directory", type=Path, default=None, help="on the disk to measure")
    args = parser.parse_args(argv)
    if args.smoke:
        args.repeat, args.workloads = 1, "tiny"
    get_registry()  # the plugins, found once before the ranks fork
    command = " ".join(["python -m benchmarks.dcp", *(argv if argv is not None else sys.argv[1:])])
    with (
        memory_kept(not args.smoke) as memory,
        tempfile.TemporaryDirectory(dir=args.directory) as directory,
    ):
        lines = [
            f"Command: `{command}`. "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, "
            f"Python {platform.python_version()}, torch {torch.__version__}, "
            f"{platform.system()} {platform.release()}, load average "
            f"{os.getloadavg()[0]:.1f} at the start; medians of {args.repeat}; times are "
            f"the slowest rank's. {memory}".rstrip(),
            "",
        ]
        for workload in args.workloads.split(","):
            lines += run_workload(workload, args, Path(directory))
            lines.append("")
    publish("\n".join(lines), "dcp", "dcp", smoke=args.smoke, docs=args.docs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
