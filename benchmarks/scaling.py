"""Aggregate checkpoint save and restore throughput with 1, 2 and 4 nodes on Dask.

Each node is a Dask worker process (a LocalCluster) holding ``--mib-per-node`` MiB of
float32 blobs, created on the worker (nothing goes through the client). A save is
``MultiNodeCheckpointManager.save`` run by a DaskSession: every node writes its own
checkpoint straight to storage, in parallel, then the client commits the epoch. A
restore is ``load`` of that epoch into every node. Throughput is the total bytes of
all nodes over the wall time seen by the client (median of ``--repeats`` runs, after
one warm-up save). Every restore is checked against checksums taken before saving.
Before each restore from local disk the page cache is dropped when the process may
do so (root), so restores read the device.

Storages: a local directory, and S3 on a local moto server (needs the ckptstore-s3
plugin and moto). The table goes to stdout and to ``benchmarks/results/scaling.md``.

Example::

    python -m benchmarks.scaling            # full run (a few minutes)
    python -m benchmarks.scaling --smoke    # ~30 s, tiny sizes (what CI runs)
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from distributed import Client, LocalCluster

from benchmarks.report import BENCHMARKS_PAGE, update_docs_section
from benchmarks.system import drop_caches, memory_kept
from benchmarks.workload import MiB
from ckptstore import MultiNodeCheckpointManager, Node, Task, TaskGroup, Workspace
from ckptstore.dask_session import DaskSession
from ckptstore.execution import WorkspaceType

DEFAULT_FORMAT = "zarr"  # ckptstore's default format
RESULTS = Path(__file__).resolve().parent / "results" / "scaling.md"


@dataclass(frozen=True)
class Storage:
    """Where a run checkpoints: a URL factory and the options every node gets."""

    name: str
    new_url: Callable[[str], str]
    options: dict[str, Any]
    cached: bool = False  # reads can come from this machine's page cache


@dataclass(frozen=True)
class Row:
    storage: str
    nodes: int
    total_bytes: int
    save_s: float
    restore_s: float

    def save_rate(self) -> float:
        return self.total_bytes / MiB / self.save_s

    def restore_rate(self) -> float:
        return self.total_bytes / MiB / self.restore_s


def make_state(ws: Workspace, *, nbytes: int, blobs: int, seed: int) -> None:
    """Fill this node's workspace with ``blobs`` float32 arrays totalling ``nbytes``."""
    rng = np.random.default_rng(seed)
    per_blob = nbytes // blobs // 4
    for index in range(blobs):
        ws[f"layer_{index:02d}/w"] = rng.standard_normal(per_blob, dtype=np.float32)


def checksum(ws: Workspace) -> dict[str, int]:
    return {name: zlib.crc32(ws[name].view(np.uint8)) for name in sorted(ws)}


def on_nodes(nodes: Sequence[str], fn: Callable[[Workspace], Any]) -> TaskGroup:
    group = TaskGroup(WorkspaceType.GLOBAL)
    for node in nodes:
        with Node(node), group:
            Task(fn, name=f"{node}/{getattr(fn, '__name__', 'task')}")
    return group


def measure(
    client: Client,
    workers: Sequence[str],
    storage: Storage,
    nodes: int,
    nbytes: int,
    repeats: int,
    db_type: str,
    blobs: int,
) -> Row:
    names = [f"node_{index}" for index in range(nodes)]
    placement = dict(zip(names, workers, strict=False))
    url = storage.new_url(f"scaling-{storage.name}-{nodes}")
    manager = MultiNodeCheckpointManager(url, db_type, storage_options=storage.options)
    with DaskSession(client, placement) as session:
        group = TaskGroup(WorkspaceType.GLOBAL)
        for seed, node in enumerate(names):
            with Node(node), group:
                Task(partial(make_state, nbytes=nbytes, blobs=blobs, seed=seed), name="make")
        session.run(group)
        before = session.run(on_nodes(names, checksum))
        session.run(manager.init(names))
        saves, restores = [], []
        for epoch in range(repeats + 1):
            started = time.perf_counter()
            session.run(manager.save(epoch))
            if epoch:  # epoch 0 is the warm-up
                saves.append(time.perf_counter() - started)
        for epoch in range(1, repeats + 1):
            session.run(on_nodes(names, lambda ws: ws.clear()))
            if storage.cached:
                drop_caches()
            started = time.perf_counter()
            session.run(manager.load(epoch))
            restores.append(time.perf_counter() - started)
            if session.run(on_nodes(names, checksum)) != before:
                raise RuntimeError(f"restored state differs from the saved one on {storage.name}")
    return Row(
        storage.name, nodes, nodes * nbytes, statistics.median(saves), statistics.median(restores)
    )


@contextmanager
def local_storage() -> Iterator[Storage]:
    with tempfile.TemporaryDirectory(prefix="ckptstore-scaling-") as root:
        yield Storage("local disk", lambda name: os.path.join(root, name), {}, cached=True)


@contextmanager
def s3_storage() -> Iterator[Storage]:
    from ckptstore.plugin import get_registry
    from ckptstore.testing.servers import MotoServer

    if "s3" not in get_registry().path_types:
        raise SystemExit(
            "the S3 rows need the ckptstore-s3 plugin: `pip install ./plugins/ckptstore-s3`"
        )
    with MotoServer() as server:
        server.create_bucket("scaling")
        options = {
            "endpoint_url": server.endpoint_url,
            "key": "testing",
            "secret": "testing",
            "region": "us-east-1",
        }
        yield Storage("S3 (moto)", lambda name: f"s3://scaling/{name}", options)


STORAGES = {"local": local_storage, "s3": s3_storage}


def markdown(rows: Sequence[Row], header: str) -> str:
    base = {row.storage: row for row in rows if row.nodes == 1}
    lines = [
        header,
        "",
        "| storage | nodes | total MiB | save s | save MiB/s | restore s | restore MiB/s "
        "| save speedup | restore speedup |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        one = base.get(row.storage, row)
        lines.append(
            f"| {row.storage} | {row.nodes} | {row.total_bytes / MiB:.0f} | {row.save_s:.3f} "
            f"| {row.save_rate():.0f} | {row.restore_s:.3f} | {row.restore_rate():.0f} "
            f"| {row.save_rate() / one.save_rate():.2f} "
            f"| {row.restore_rate() / one.restore_rate():.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one repeat (~30 s)")
    parser.add_argument("--nodes", default="1,2,4", help="node counts (default 1,2,4)")
    parser.add_argument("--storage", default="local,s3", help="local and/or s3")
    parser.add_argument("--mib-per-node", type=int, default=128)
    parser.add_argument("--blobs", type=int, default=16, help="blobs per node")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--db-type", default=DEFAULT_FORMAT)
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--docs", action="store_true", help="also update docs/benchmarks-tables.md")
    args = parser.parse_args(argv)
    if args.smoke:
        args.mib_per_node, args.blobs, args.repeats = 4, 4, 1
    counts = [int(count) for count in args.nodes.split(",")]
    storages = [STORAGES[name.strip()] for name in args.storage.split(",")]
    nbytes = args.mib_per_node * MiB

    cold = "cold" if drop_caches() else "warm (page cache not dropped: not root)"
    rows: list[Row] = []
    started = time.perf_counter()
    with (
        memory_kept(not args.smoke) as memory,
        LocalCluster(
            n_workers=max(counts),
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            silence_logs=logging.ERROR,
        ) as cluster,
        Client(cluster) as client,
    ):
        workers = sorted(client.nthreads())
        for make_storage in storages:
            with ExitStack() as stack:
                storage = stack.enter_context(make_storage())
                for count in counts:
                    row = measure(
                        client,
                        workers,
                        storage,
                        count,
                        nbytes,
                        args.repeats,
                        args.db_type,
                        args.blobs,
                    )
                    rows.append(row)
                    print(
                        f"{row.storage}, {count} node(s): save {row.save_rate():.0f} MiB/s, "
                        f"restore {row.restore_rate():.0f} MiB/s",
                        file=sys.stderr,
                    )
    command = " ".join(["python -m benchmarks.scaling", *(sys.argv[1:] if argv is None else argv)])
    header = (
        f"Aggregate checkpoint throughput on Dask ({args.mib_per_node} MiB per node, "
        f"{args.blobs} float32 blobs each, db_type={args.db_type!r}, median of {args.repeats}; "
        f"one worker process per node; local-disk restores {cold}; {os.cpu_count()} CPUs, "
        f"{platform.system()}; `{command}`, {time.perf_counter() - started:.0f} s). {memory}"
    ).rstrip()
    table = markdown(rows, header)
    print(table)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(table)
    if args.docs:
        update_docs_section(BENCHMARKS_PAGE, "scaling", table.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
