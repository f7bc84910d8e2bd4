"""Incremental saves against full saves of the same states, in one run (issue 40).

Workloads (each a dict of float32 arrays, changed between epochs as training would):

* ``lora``: a frozen base of 64 x 16 MiB (1 GiB) and a trainable state of 1% of it
  (64 adapters, with their two Adam moments: the 1% includes the moments), all of which
  changes every epoch;
* ``lora-frozen``: the same, the base declared unchanged (``save_tree(...,
  frozen=...)``: its bytes are not read again);
* ``sparse-ranges``: a 1 GiB embedding table (rows of 4 KiB), 5% of its rows changed
  per epoch in 4 contiguous ranges;
* ``sparse-scattered``: the same 5% as single rows spread over the table;
* ``dense``: 64 x 16 MiB, every byte changes every epoch;
* ``two-node``: two nodes holding the same 512 MiB (replicated), 1% changing per epoch.

Each epoch is saved incrementally (``save_tree(..., incremental=True)``) into one root;
the first ``--full-epochs`` epochs are also saved in full into another root, alternating
with the incremental save of the same state (saves are durable: fsync). Reported:
bytes written per save after the first (the growth of the root), save time and the
process's CPU time (medians; the CPU time is the steadier measure on a loaded machine),
the root's bytes after all epochs (the full saves' is their size times the epochs), the
root's bytes after deleting all but the newest epoch and collecting, and the load time of
the newest epoch against a full epoch of the same state, alternating ``--loads`` times
(each goes first in turn): the first load (cold: saves write ``O_DIRECT``), and the
medians of the later ones (wall-clock and CPU; the page cache may hold them, unless
other jobs evict it).

    python -m benchmarks.incremental              # 20 epochs, local disk (/tmp)
    python -m benchmarks.incremental --s3         # on a moto server instead
    python -m benchmarks.incremental --smoke      # tiny states, 3 epochs (CI)
    python -m benchmarks.incremental --floor      # what a LoRA-shaped save cannot beat
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from benchmarks.report import publish
from benchmarks.system import memory_kept
from ckptstore.checkpoint._retention import KeepLast, enforce
from ckptstore.protocol import CheckpointLocation, collect_chunks
from ckptstore.tree import load_tree, save_tree

Array = np.ndarray[Any, Any]
MiB = 1 << 20
State = dict[str, dict[str, Array]]
"""Per node, its blobs."""


@dataclass
class Workload:
    name: str
    make: Callable[[float], State]
    step: Callable[[State, int, np.random.Generator], None]
    frozen: tuple[str, ...] = ()
    """Prefixes of the blobs an incremental save declares frozen."""


def _layers(count: int, nbytes: int, rng: np.random.Generator) -> dict[str, Array]:
    return {f"layer{n}": rng.standard_normal(nbytes // 4, dtype=np.float32) for n in range(count)}


def make_lora(scale: float) -> State:
    rng = np.random.default_rng(0)
    base = _layers(64, int(16 * MiB * scale), rng)
    adapter = int(16 * MiB * scale) // 100 // 3  # weights, m and v: 1% of the base
    state = {f"base/{k}": v for k, v in base.items()}
    for n in range(64):
        for part in ("w", "m", "v"):
            state[f"lora{n}/{part}"] = rng.standard_normal(adapter // 4, dtype=np.float32)
    return {"trainer_0": state}


def step_lora(state: State, epoch: int, rng: np.random.Generator) -> None:
    for name, array in state["trainer_0"].items():
        if name.startswith("lora"):
            array += 1e-3


def make_table(scale: float) -> State:
    rows = int(262_144 * scale)
    table = np.random.default_rng(1).standard_normal((rows, 1024), dtype=np.float32)
    return {"trainer_0": {"embedding": table}}


def step_ranges(state: State, epoch: int, rng: np.random.Generator) -> None:
    table = state["trainer_0"]["embedding"]
    span = table.shape[0] * 5 // 100 // 4
    for _ in range(4):
        start = int(rng.integers(0, table.shape[0] - span))
        table[start : start + span] += 1e-3


def step_scattered(state: State, epoch: int, rng: np.random.Generator) -> None:
    table = state["trainer_0"]["embedding"]
    rows = rng.choice(table.shape[0], table.shape[0] * 5 // 100, replace=False)
    table[rows] += 1e-3


def make_dense(scale: float) -> State:
    return {"trainer_0": _layers(64, int(16 * MiB * scale), np.random.default_rng(2))}


def step_dense(state: State, epoch: int, rng: np.random.Generator) -> None:
    for array in state["trainer_0"].values():
        array += 1e-3


def make_two_nodes(scale: float) -> State:
    shared = _layers(32, int(16 * MiB * scale), np.random.default_rng(3))
    return {"trainer_0": shared, "trainer_1": shared}  # the same arrays: replicated


def step_two_nodes(state: State, epoch: int, rng: np.random.Generator) -> None:
    first = state["trainer_0"]["layer0"]
    first[: first.size // 3] += 1e-3  # about 1% of the 512 MiB


WORKLOADS = [
    Workload("lora", make_lora, step_lora),
    Workload("lora-frozen", make_lora, step_lora, ("base/",)),
    Workload("sparse-ranges", make_table, step_ranges),
    Workload("sparse-scattered", make_table, step_scattered),
    Workload("dense", make_dense, step_dense),
    Workload("two-node", make_two_nodes, step_two_nodes),
]


@dataclass
class Result:
    workload: str
    state_bytes: int
    full_written: float
    incremental_written: float
    full_save: float
    incremental_save: float
    full_cpu: float
    incremental_cpu: float
    full_stored: int
    incremental_stored: int
    newest_only: int
    full_load: float
    incremental_load: float
    full_load_cpu: float
    incremental_load_cpu: float
    full_first: float
    incremental_first: float


def stored_bytes(location: CheckpointLocation) -> int:
    storage = location.storage
    return sum(storage.size(key) for key in storage.list_keys(""))


def save_state(
    location: CheckpointLocation,
    epoch: int,
    state: State,
    incremental: bool,
    frozen: tuple[str, ...] = (),
) -> tuple[float, float]:
    """The save's wall-clock and CPU seconds."""
    started, cpu = time.perf_counter(), time.process_time()
    for node, blobs in state.items():
        declared = [name for name in blobs if name.startswith(frozen)] if frozen else []
        save_tree(location, epoch, blobs, node=node, incremental=incremental, frozen=declared)
    return time.perf_counter() - started, time.process_time() - cpu


def load_state(location: CheckpointLocation, epoch: int, state: State) -> tuple[float, float]:
    """The load's wall-clock and CPU seconds."""
    started, cpu = time.perf_counter(), time.process_time()
    for node in state:
        load_tree(location, epoch, node=node)
    return time.perf_counter() - started, time.process_time() - cpu


def run(workload: Workload, opened: Callable[[str], CheckpointLocation], args: Any) -> Result:
    state = workload.make(args.scale)
    nbytes = sum(a.nbytes for blobs in state.values() for a in blobs.values())
    rng = np.random.default_rng(7)
    full, incremental = opened(f"{workload.name}-full"), opened(f"{workload.name}-incr")
    full_times, incr_times, full_writes, incr_writes = [], [], [], []
    full_cpu, incr_cpu = [], []
    for epoch in range(args.epochs):
        if epoch:
            workload.step(state, epoch, rng)
        before = stored_bytes(incremental)
        wall, cpu = save_state(incremental, epoch, state, True, workload.frozen if epoch else ())
        incr_times.append(wall)
        incr_cpu.append(cpu)
        if epoch:
            incr_writes.append(stored_bytes(incremental) - before)
        if epoch < args.full_epochs:
            if epoch:  # only the newest full epoch is kept: the disk holds 20 x 1 GiB badly
                enforce(full.storage, KeepLast(1))
            before = stored_bytes(full)
            wall, cpu = save_state(full, epoch, state, False)
            full_times.append(wall)
            full_cpu.append(cpu)
            full_writes.append(stored_bytes(full) - before)
    newest = args.epochs - 1
    full_epoch = min(args.full_epochs, args.epochs) - 1
    incr_stored = stored_bytes(incremental)
    full_loads, incr_loads = [], []
    for turn in range(args.loads):  # in turn first: neither gains from the other's leftovers
        if turn % 2:
            incr_loads.append(load_state(incremental, newest, state))
        full_loads.append(load_state(full, full_epoch, state))
        if not turn % 2:
            incr_loads.append(load_state(incremental, newest, state))
    enforce(incremental.storage, KeepLast(1))
    collect_chunks(incremental.storage)
    newest_only = stored_bytes(incremental)
    for location in (full, incremental):  # 20 epochs of 1 GiB: the disk is shared
        location.storage.delete(location.storage.list_keys(""))
    return Result(
        workload.name,
        nbytes,
        statistics.median(full_writes),
        statistics.median(incr_writes),
        statistics.median(full_times[1:] or full_times),
        statistics.median(incr_times[1:]),
        statistics.median(full_cpu[1:] or full_cpu),
        statistics.median(incr_cpu[1:]),
        statistics.median(full_writes) * args.epochs,
        incr_stored,
        newest_only,
        statistics.median(wall for wall, _ in full_loads[1:] or full_loads),
        statistics.median(wall for wall, _ in incr_loads[1:] or incr_loads),
        statistics.median(cpu for _, cpu in full_loads[1:] or full_loads),
        statistics.median(cpu for _, cpu in incr_loads[1:] or incr_loads),
        full_loads[0][0],
        incr_loads[0][0],
    )


def floor(opened: Callable[[str], CheckpointLocation], args: Any) -> str:
    """What a LoRA-shaped incremental save cannot go below, measured beside a full save:
    the trainable part alone saved in full, one write and fsync of its bytes, and a
    read (XXH3-128) of the whole state on one thread and on every core."""
    state = make_lora(args.scale)
    blobs = state["trainer_0"]
    trainable = {name: array for name, array in blobs.items() if name.startswith("lora")}
    data = np.concatenate([array.reshape(-1).view(np.uint8) for array in trainable.values()])
    full, alone = opened("floor-full"), opened("floor-trainable")
    directory = Path(tempfile.mkdtemp(prefix="ckptstore-floor-", dir=args.dir))
    pool = ThreadPoolExecutor(os.cpu_count() or 1)
    views = [memoryview(array).cast("B") for array in blobs.values()]
    rows: dict[str, list[float]] = {}
    for epoch in range(args.full_epochs + 2):
        for location in (full, alone):
            if epoch:
                enforce(location.storage, KeepLast(1))
        rows.setdefault("full save", []).append(save_state(full, epoch, state, False)[0])
        parts = {"trainer_0": trainable}
        rows.setdefault("trainable alone, full save", []).append(
            save_state(alone, epoch, parts, False)[0]
        )
        started = time.perf_counter()
        fd = os.open(directory / f"raw-{epoch}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.write(fd, data.data)
        os.fsync(fd)
        os.close(fd)
        os.unlink(directory / f"raw-{epoch}")
        rows.setdefault("its bytes: one write + fsync", []).append(time.perf_counter() - started)
        started = time.perf_counter()
        for view in views:
            xxhash.xxh3_128_hexdigest(view)
        rows.setdefault("XXH3-128 of the state, 1 thread", []).append(time.perf_counter() - started)
        started = time.perf_counter()
        list(pool.map(xxhash.xxh3_128_hexdigest, views))
        rows.setdefault(f"... on {os.cpu_count()} threads", []).append(
            time.perf_counter() - started
        )
    for location in (full, alone):
        location.storage.delete(location.storage.list_keys(""))
    directory.rmdir()
    lines = [
        f"Floor of a LoRA-shaped save ({data.nbytes / MiB:.1f} MiB trainable), "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {os.getloadavg()[0]:.1f}",
        "",
        "| what | median s | x faster than the full save |",
        "|---|---:|---:|",
    ]
    whole = statistics.median(rows["full save"][1:])
    for name, times in rows.items():
        median = statistics.median(times[1:])
        lines.append(f"| {name} | {median:.3f} | {whole / median:.1f}x |")
    return "\n".join(lines)


@contextlib.contextmanager
def locations(s3: bool, directory: str | None) -> Iterator[Callable[[str], CheckpointLocation]]:
    if not s3:
        root = Path(tempfile.mkdtemp(prefix="ckptstore-incremental-", dir=directory))
        try:
            yield lambda name: CheckpointLocation.open(str(root / name), "zarr")
        finally:
            shutil.rmtree(root, ignore_errors=True)
        return
    from ckptstore.testing.servers import MotoServer

    with MotoServer() as server:
        server.create_bucket("bench")
        options = {
            "endpoint_url": server.endpoint_url,
            "key": "bench",
            "secret": "bench-secret",
            "region": "us-east-1",
        }
        yield lambda name: CheckpointLocation.open(
            f"s3://bench/{name}", "zarr", storage_options=options
        )


def table(results: list[Result], where: str, args: Any) -> str:
    lines = [
        f"Incremental against full saves, {where}, {args.epochs} epochs "
        f"(full saves: the first {args.full_epochs}), scale {args.scale}; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. Medians. "
        f"Load average (1 min) at the start and the end: {args.load_start:.1f}, "
        f"{os.getloadavg()[0]:.1f}. {args.memory}".rstrip(),
        "",
        "| workload | state | written per save: full / incr. (x less) | save s: full / incr. "
        "(x faster) | save CPU s: full / incr. (x less) | stored after all epochs: "
        "full / incr. | newest only, collected (x one full) | first load s (cold): full / "
        "incr. (x) | later loads s: full / incr. (x) | their CPU s: full / incr. (x) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r.workload} | {r.state_bytes / MiB:.0f} MiB "
            f"| {r.full_written / MiB:.1f} / {r.incremental_written / MiB:.1f} MiB "
            f"({r.full_written / max(r.incremental_written, 1):.1f}x) "
            f"| {r.full_save:.3f} / {r.incremental_save:.3f} "
            f"({r.full_save / r.incremental_save:.2f}x) "
            f"| {r.full_cpu:.3f} / {r.incremental_cpu:.3f} "
            f"({r.full_cpu / max(r.incremental_cpu, 1e-6):.2f}x) "
            f"| {r.full_stored / MiB:.0f} / {r.incremental_stored / MiB:.0f} MiB "
            f"| {r.newest_only / MiB:.0f} MiB ({r.newest_only / r.full_written:.2f}x) "
            f"| {r.full_first:.3f} / {r.incremental_first:.3f} "
            f"({r.incremental_first / r.full_first:.2f}x) "
            f"| {r.full_load:.3f} / {r.incremental_load:.3f} "
            f"({r.incremental_load / r.full_load:.2f}x) "
            f"| {r.full_load_cpu:.3f} / {r.incremental_load_cpu:.3f} "
            f"({r.incremental_load_cpu / max(r.full_load_cpu, 1e-6):.2f}x) |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny states, 3 epochs")
    parser.add_argument("--s3", action="store_true", help="on a moto server, not local disk")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--full-epochs", type=int, default=5)
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of each state")
    parser.add_argument("--workload", action="append", choices=[w.name for w in WORKLOADS])
    parser.add_argument("--loads", type=int, default=5, help="loads of each, alternating")
    parser.add_argument("--dir", help="where local roots go (default: the temp directory)")
    parser.add_argument("--docs", action="store_true", help="update docs/benchmarks-tables.md")
    parser.add_argument("--floor", action="store_true", help="what a LoRA save cannot beat")
    args = parser.parse_args(argv)
    args.load_start = os.getloadavg()[0]
    if args.smoke:
        args.epochs, args.full_epochs, args.scale = 3, 3, 1 / 64
    chosen = [w for w in WORKLOADS if not args.workload or w.name in args.workload]
    where = "moto S3 (loopback)" if args.s3 else "local disk"
    if args.floor:
        with locations(args.s3, args.dir) as opened:
            print(floor(opened, args))
        return 0
    with memory_kept(not args.smoke) as args.memory, locations(args.s3, args.dir) as opened:
        results = [run(workload, opened, args) for workload in chosen]
    name = "incremental-s3" if args.s3 else "incremental"
    publish(table(results, where, args), name, name, smoke=args.smoke, docs=args.docs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
