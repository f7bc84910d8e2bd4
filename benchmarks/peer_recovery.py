"""Recovery of one lost node of three: from a peer replica (``DaskSession(client,
peer_replicas=1)``) against from S3 (moto with +20 ms per request and a 250 MiB/s cap).

Three Dask worker processes (a LocalCluster), one node each with ``--mib`` MiB of
float64 state in 8 blobs. The job saves one epoch to ``s3://`` and its peer replicas are
shipped. Then the worker holding ``trainer_1`` is killed (SIGKILL) and its local
directory removed; the nanny starts a fresh worker, and ``trainer_1`` is restored on it
(``CheckpointManager.init`` + ``load`` in a new session, the node pinned to the fresh
worker), alternately from the peer replica and from S3, ``--repeat`` times each. Every
restore's bytes are checked (CRC-32C of each blob on the worker); the peer restores must
report a restore from a peer, the S3 ones none.

The S3 link: the moto server runs in a network namespace; ``tc netem`` adds the delay
and the rate cap when the kernel has netem, else the user-space relay of
:mod:`benchmarks.network` does both. Needs root (``--no-latency``: moto on loopback,
no delay and no cap).

Example::

    python -m benchmarks.peer_recovery --docs      # 3 x 1 GiB, 3 restores each (root)
    python -m benchmarks.peer_recovery --smoke     # 3 x 8 MiB, under a minute (CI)
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import platform
import statistics
import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
from distributed import Client, LocalCluster, get_worker, wait

from benchmarks.network import NetworkNamespace
from benchmarks.object_store import KEY, SECRET, delayed_server, loopback_server, moto_storage
from benchmarks.report import publish
from benchmarks.system import memory_kept
from ckptstore import CheckpointManager, MultiNodeCheckpointManager, Node, Task, TaskGroup
from ckptstore.dask_session import DaskSession
from ckptstore.dask_session._piece_transfer import PieceArrivals, serve_pieces
from ckptstore.dask_session._replica_pieces import ReplicaPiece
from ckptstore.execution import Workspace, WorkspaceType
from ckptstore.io import crc32c_of
from ckptstore.testing.dask_workers import kill_worker

NODES = ("trainer_0", "trainer_1", "trainer_2")
LOST = "trainer_1"
BLOBS = 8
MiB = 1 << 20
ROOT = "s3://bench/peers"


def fill(ws: Workspace, *, node: str, nbytes: int) -> None:
    """``node``'s state: :data:`BLOBS` blobs of random float64 (seeded by the node)."""
    rng = np.random.default_rng(NODES.index(node))
    for index in range(BLOBS):
        ws[f"{node}/w{index}"] = rng.random(nbytes // BLOBS // 8)


def digest(ws: Workspace, *, node: str) -> list[int]:
    """The CRC-32C of each of ``node``'s blobs, in name order (computed on the worker)."""
    names = sorted(name for name in ws if name.startswith(f"{node}/"))
    if len(names) != BLOBS:
        raise RuntimeError(f"node {node!r} holds {len(names)} blobs, not {BLOBS}")
    return [crc32c_of([memoryview(ws[name]).cast("B")]) for name in names]


def _group(build: Any) -> TaskGroup:
    group = TaskGroup(WorkspaceType.GLOBAL)
    for node in NODES:
        with Node(node), group:
            build(node)
    return group


def warm_up(client: Client, worker: str, options: dict[str, str]) -> None:
    """Import on ``worker`` what a restore uses, by reading the lost node's blob names
    from S3 (untimed: a restart pays the imports whichever source it restores from)."""
    manager = CheckpointManager(ROOT, LOST, storage_options=options)
    with DaskSession(client, {LOST: worker}) as session, Node(LOST):
        session.run(manager.init([LOST], retrieve_from_epoch=1))


def restore_lost(
    client: Client, worker: str, options: dict[str, str], *, from_peer: bool
) -> tuple[float, list[int]]:
    """Restore :data:`LOST` on ``worker`` in a new session; seconds and blob CRCs."""
    manager = CheckpointManager(ROOT, LOST, storage_options=options)
    with DaskSession(client, {LOST: worker}, peer_replicas=1 if from_peer else 0) as session:
        with Node(LOST):
            init = manager.init([LOST], retrieve_from_epoch=1)
        started = time.perf_counter()
        session.run(init)
        mid = time.perf_counter()
        session.run(manager.load(1))
        seconds = time.perf_counter() - started
        print(
            f"    init {mid - started:.2f} s (the peer: with its fetch), load {seconds - mid + started:.2f} s",
            flush=True,
        )
        with Node(LOST):
            [crcs] = session.run(Task(lambda ws: digest(ws, node=LOST)))
        restored = session.restored_from_peers()
    if restored != ([(LOST, 1)] if from_peer else []):
        raise RuntimeError(f"expected a {'peer' if from_peer else 'root'} restore: {restored}")
    assert isinstance(crcs, list)
    return seconds, crcs


def _bytes(nbytes: int) -> np.ndarray:
    return np.ones(nbytes, np.uint8)


def _size(data: np.ndarray) -> int:
    return int(data.nbytes)


def transfer_seconds(client: Client, source: str, target: str, nbytes: int) -> float:
    """Seconds Dask takes to move ``nbytes`` as one array from ``source`` to ``target``
    (and run a task there)."""
    data = client.submit(_bytes, nbytes, workers=[source], allow_other_workers=False, pure=False)
    wait([data])
    started = time.perf_counter()
    moved = client.submit(_size, data, workers=[target], allow_other_workers=False, pure=False)
    if moved.result() != nbytes:
        raise RuntimeError("the transfer lost bytes")
    seconds = time.perf_counter() - started
    del data, moved
    return seconds


def _served_piece(nbytes: int) -> ReplicaPiece:
    serve_pieces(get_worker())
    return ReplicaPiece(np.ones(nbytes, np.uint8))


def _received(sources: list[tuple[str, str]]) -> int:
    arrivals = PieceArrivals(get_worker(), sources)
    return sum(int(piece.result().data.nbytes) for piece in arrivals.pieces)


def pieces_seconds(client: Client, source: str, target: str, nbytes: int) -> float:
    """Seconds ``nbytes`` take from ``source`` to ``target`` as a restore moves them:
    pieces of one blob each (:data:`BLOBS` of them), each one Dask key sent in one frame,
    two at a time (:mod:`ckptstore.dask_session._piece_transfer`), with nothing checked,
    placed or read from the root."""
    piece = max(1, nbytes // BLOBS)
    data = [
        client.submit(
            _served_piece,
            min(piece, nbytes - start),
            workers=[source],
            allow_other_workers=False,
            pure=False,
        )
        for start in range(0, nbytes, piece)
    ]
    wait(data)
    sources = [(source, str(future.key)) for future in data]
    started = time.perf_counter()
    moved = client.submit(
        _received, sources, workers=[target], allow_other_workers=False, pure=False
    )
    if moved.result() != nbytes:
        raise RuntimeError("the transfer lost bytes")
    seconds = time.perf_counter() - started
    del data, moved
    return seconds


def measure(endpoint: str, nbytes: int, repeat: int) -> dict[str, Any]:
    options = {"endpoint_url": endpoint, "key": KEY, "secret": SECRET, "region": "us-east-1"}
    with (
        LocalCluster(
            n_workers=len(NODES),
            threads_per_worker=2,
            processes=True,
            memory_limit=0,
            dashboard_address=None,
            silence_logs=logging.ERROR,
        ) as cluster,
        Client(cluster) as client,
    ):
        manager = MultiNodeCheckpointManager(ROOT, storage_options=options)
        with DaskSession(client, peer_replicas=1) as session:
            session.run(
                _group(lambda node: Task(lambda ws, n=node: fill(ws, node=n, nbytes=nbytes)))
            )
            session.run(manager.init(list(NODES)))
            with Node(LOST):
                [expected] = session.run(Task(lambda ws: digest(ws, node=LOST)))
            started = time.perf_counter()
            session.run(manager.save(1))
            save = time.perf_counter() - started
            session.run(_group(lambda node: Task(lambda ws: ws.clear())))  # the copies come from S3
            shipped = session.wait_for_peer_replicas()
            ship = time.perf_counter() - started - save
            victim = session.node_to_worker()[LOST]
        print(
            f"saved 1 epoch in {save:.2f} s; peer replicas in place {ship:.2f} s later", flush=True
        )
        fresh = kill_worker(client, victim, timeout=120)
        print(f"killed {victim}; fresh worker {fresh}", flush=True)
        warm_up(client, fresh, options)
        times: dict[str, list[float]] = {"peer": [], "s3": [], "comm": [], "pieces": []}
        for _ in range(repeat):
            seconds = transfer_seconds(client, shipped[LOST].peers[0], fresh, nbytes)
            times["comm"].append(seconds)
            print(
                f"  Dask moving {nbytes / MiB:.0f} MiB peer to fresh: {seconds:.2f} s", flush=True
            )
            seconds = pieces_seconds(client, shipped[LOST].peers[0], fresh, nbytes)
            times["pieces"].append(seconds)
            print(f"  the same as a restore moves them: {seconds:.2f} s", flush=True)
            for source in ("peer", "s3"):
                seconds, crcs = restore_lost(client, fresh, options, from_peer=source == "peer")
                if crcs != expected:
                    raise RuntimeError(f"the {source} restore did not bring the bytes back")
                times[source].append(seconds)
                print(f"  restore from {source}: {seconds:.2f} s", flush=True)
        DaskSession(client).drop_peer_replicas()
    return {
        "save": save,
        "ship": ship,
        "replica_bytes": shipped[LOST].nbytes,
        "peer": times["peer"],
        "s3": times["s3"],
        "comm": times["comm"],
        "pieces": times["pieces"],
    }


@contextlib.contextmanager
def s3_link(
    latency_ms: float, rate_mibps: float, *, no_latency: bool, in_memory: bool = False
) -> Iterator[tuple[str, str]]:
    """The S3 endpoint and a description of its link (``in_memory``: moto writes no
    object to a temporary file)."""
    kept = f", {moto_storage(True)}" if in_memory else ""
    if no_latency:
        with loopback_server(in_memory=in_memory) as endpoint:
            yield endpoint, f"moto on loopback, no added latency or cap{kept}"
        return
    with NetworkNamespace("ckptpeers", delay_ms=latency_ms, rate_mibps=rate_mibps) as network:
        how = "tc netem" if network.netem else "a user-space relay (no sch_netem here)"
        how += "; the cap by netem's rate" if network.netem else "; the cap by tbf"
        port = 9600 + os.getpid() % 300
        with delayed_server(network, latency_ms, port, in_memory=in_memory) as endpoint:
            yield (
                endpoint,
                (f"moto, +{latency_ms:g} ms per request and {rate_mibps:g} MiB/s ({how}){kept}"),
            )


def report(result: dict[str, Any], args: argparse.Namespace, link: str) -> str:
    peer, s3 = statistics.median(result["peer"]), statistics.median(result["s3"])
    nbytes = args.mib * MiB
    floor = nbytes / (args.rate_mibps * MiB) if not args.no_latency else 0.0
    command = " ".join(["python -m benchmarks.peer_recovery", *(args.argv or sys.argv[1:])])
    lines = [
        f"Command: `{command}`. Machine: {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, {platform.system()} {platform.release()}; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        f"3 Dask worker processes, one node each of {args.mib} MiB ({BLOBS} float64 blobs, "
        f"zarr); S3: {link}. The lost node's worker is killed (SIGKILL, local directory "
        f"removed) and the node restored on the fresh worker; medians of {args.repeat}. "
        f"{args.memory}".rstrip(),
        "",
        "| restore of the lost node | seconds | GiB/s | peer faster by |",
        "|---|---:|---:|---:|",
        f"| from a peer replica | {peer:.2f} | {nbytes / peer / (1 << 30):.3f} | |",
        f"| from S3 | {s3:.2f} | {nbytes / s3 / (1 << 30):.3f} | {s3 / peer:.1f}x |",
    ]
    if floor:
        lines.append(
            f"| S3's floor at {args.rate_mibps:g} MiB/s (bytes / cap, no latency) | {floor:.2f} "
            f"| {args.rate_mibps / 1024:.3f} | {floor / peer:.1f}x |"
        )
    comm = statistics.median(result["comm"])
    lines.append(
        f"| Dask moving the bytes as one array, peer to fresh worker "
        f"| {comm:.2f} | {nbytes / comm / (1 << 30):.3f} | |"
    )
    pieces = statistics.median(result["pieces"])
    lines.append(
        f"| the peer's floor: the same bytes moved as the restore moves them, in pieces of "
        f"one blob ({nbytes // BLOBS // MiB} MiB), each one Dask key in one frame, nothing "
        f"checked | {pieces:.2f} | {nbytes / pieces / (1 << 30):.3f} | |"
    )
    rounds = ", ".join(
        f"{s3 / peer:.1f}x" for peer, s3 in zip(result["peer"], result["s3"], strict=True)
    )
    lines += [
        "",
        f"Rounds (peer, then S3, one after the other): peer faster by {rounds}.",
        "",
        f"The save of the epoch to S3 took {result['save']:.1f} s; the replicas were in "
        f"place {result['ship']:.1f} s later (read back from S3 and sent to the peers, in "
        f"the background). Each replica: {result['replica_bytes'] / MiB:.0f} MiB in one "
        "peer's memory.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="3 x 8 MiB, one restore each")
    parser.add_argument("--mib", type=int, default=1024, help="state per node (MiB)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--rate-mibps", type=float, default=250.0)
    parser.add_argument("--no-latency", action="store_true", help="moto on loopback")
    parser.add_argument(
        "--moto-in-memory",
        action="store_true",
        help="moto keeps its objects in memory, not in temporary files (as in benchmarks.tiers)",
    )
    parser.add_argument("--docs", action="store_true", help="update docs/benchmarks-tables.md")
    args = parser.parse_args(argv)
    args.argv = argv
    if args.smoke:
        args.mib, args.repeat = 8, 1
    with (
        memory_kept(not args.smoke) as args.memory,
        s3_link(
            args.latency_ms,
            args.rate_mibps,
            no_latency=args.no_latency,
            in_memory=args.moto_in_memory,
        ) as (endpoint, link),
    ):
        print(f"S3: {link}", flush=True)
        result = measure(endpoint, args.mib * MiB, args.repeat)
    publish(
        report(result, args, link),
        "peer_recovery",
        "peer-recovery",
        smoke=args.smoke,
        docs=args.docs,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
