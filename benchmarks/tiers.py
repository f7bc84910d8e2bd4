"""Tiers: a training loop saving to S3 only, against local disk then S3 in the background.

A loop of ``--epochs`` epochs (10) of fixed compute (numpy matmuls for
``--compute-seconds``, then an in-place update of every blob, as an optimizer step)
saving ``--mib`` MiB (512) of float32 state after every epoch, each row against a fresh
moto server in a network namespace with ``--delay-ms`` (20) added per packet and a
bandwidth cap of ``--mibps`` MiB/s (250; netem's ``delay`` and ``rate``, from
:class:`benchmarks.network.NetworkNamespace`). Rows:

* ``local only``: ``CheckpointManager("/tmp/...")``, the speed the fast tier gives;
* ``S3 only``: ``CheckpointManager("s3://bench/run")``, synchronous saves;
* ``local then S3``: ``CheckpointManager(["/tmp/...", "s3://bench/run"])``: saves commit
  on local disk, the S3 copy runs in the background (:mod:`ckptstore.checkpoint._tiers`).

Reported: time blocked per save (median), the loop's wall time (including, for the
tiered row, the wait at the end until S3 holds the last epoch), and the durable tier's
lag: how many epochs S3 was behind the local root at each save (median and highest).

    python -m benchmarks.tiers           # full run: benchmarks/results/tiers.md
    python -m benchmarks.tiers --smoke   # 16 MiB, 3 epochs, loopback moto (CI, < 60 s)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks.network import NetworkNamespace
from benchmarks.object_store import KEY, SECRET, delayed_server, loopback_server
from benchmarks.report import publish
from ckptstore import LocalSession, Node
from ckptstore.checkpoint import CheckpointManager
from ckptstore.protocol import CheckpointLocation

MiB = 1 << 20
BLOB_MIB = 32


@dataclass(frozen=True)
class Loop:
    name: str
    blocked: list[float]
    wall: float
    lags: list[int]


def make_state(mib: int) -> dict[str, np.ndarray[Any, Any]]:
    """``mib`` MiB of float32 blobs of up to 32 MiB each."""
    sizes = [BLOB_MIB] * (mib // BLOB_MIB) + ([mib % BLOB_MIB] if mib % BLOB_MIB else [])
    rng = np.random.default_rng(0)
    return {f"layer{i}/w": rng.random(size * MiB // 4, np.float32) for i, size in enumerate(sizes)}


def compute(state: dict[str, np.ndarray[Any, Any]], seconds: float) -> None:
    """An epoch: matmuls for ``seconds``, then every blob updated in place."""
    a = np.ones((256, 256), np.float32)
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        a = (a @ a) * np.float32(1e-3)
    for array in state.values():
        array += np.float32(1)


def run_loop(
    name: str,
    roots: list[str | CheckpointLocation],
    state: dict[str, Any],
    args: argparse.Namespace,
) -> Loop:
    session = LocalSession()
    session.workspace("trainer_0").update(state)
    manager = CheckpointManager(roots, "trainer_0", "zarr")
    with Node("trainer_0"):
        session.run(manager.init(["trainer_0"]))
    blocked: list[float] = []
    lags: list[int] = []
    started = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        compute(session.workspace("trainer_0"), args.compute_seconds)  # type: ignore[arg-type]
        before = time.perf_counter()
        session.run(manager.save(epoch))
        blocked.append(time.perf_counter() - before)
        if manager.tiers is not None:
            copied = next(iter(manager.tiers.newest_copied().values()))
            lags.append(epoch - (copied or 0))
    if manager.tiers is not None:
        manager.tiers.ensure(args.epochs, ["trainer_0"])
    return Loop(name, blocked, time.perf_counter() - started, lags)


@contextlib.contextmanager
def server(args: argparse.Namespace) -> Iterator[tuple[str, str]]:
    """A fresh moto server: (endpoint, what limits it)."""
    if args.smoke:
        with loopback_server() as endpoint:
            yield endpoint, "loopback, no limits"
        return
    with NetworkNamespace("tiers", delay_ms=args.delay_ms, rate_mibps=args.mibps) as network:
        delay = (
            f"+{args.delay_ms:g} ms per packet (netem)"
            if network.netem
            else f"+{args.delay_ms:g} ms per request (user-space relay: no netem here)"
        )
        cap = "netem rate" if network.netem else "tbf on both ends of the veth pair"
        limits = f"{delay}, {args.mibps:g} MiB/s cap ({cap})"
        with delayed_server(network, args.delay_ms, 9000 + int(time.time()) % 500) as endpoint:
            yield endpoint, limits


def s3_root(endpoint: str) -> CheckpointLocation:
    options = {"endpoint_url": endpoint, "key": KEY, "secret": SECRET, "region": "us-east-1"}
    return CheckpointLocation.open("s3://bench/run", "zarr", storage_options=options)


def table(loops: list[Loop], args: argparse.Namespace, limits: str) -> str:
    local = next(loop for loop in loops if loop.name == "local only")
    s3 = next(loop for loop in loops if loop.name == "S3 only")
    base = statistics.median(local.blocked)
    tiered = next(loop for loop in loops if loop.name == "local then S3")
    blocked = statistics.median(tiered.blocked)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [
        f"`python -m benchmarks.tiers{' --smoke' if args.smoke else ''}`, {when}, load "
        f"average {args.load:.1f} at the start (2 CPUs shared with other work). "
        f"{args.epochs} epochs of {args.compute_seconds:g} s compute, {args.mib} MiB of state "
        f"saved after each; moto S3: {limits}.",
        "",
        "| loop | blocked per save (median) | vs local only | vs S3 only | loop wall time "
        "| S3 lag, epochs (median / max) |",
        "|---|---|---|---|---|---|",
    ]
    for loop in loops:
        median = statistics.median(loop.blocked)
        lag = (
            f"{statistics.median(loop.lags):g} / {max(loop.lags)}"
            if loop.lags
            else ("0 (synchronous)" if loop.name == "S3 only" else "-")
        )
        lines.append(
            f"| {loop.name} | {median:.3f} s | {median / base:.2f}x "
            f"| {statistics.median(s3.blocked) / median:.1f}x less | {loop.wall:.1f} s | {lag} |"
        )
    lines += [
        "",
        "| target (issue 41) | met | measured |",
        "|---|---|---|",
        f"| blocked, local then S3 <= 1.1x local only | {_met(blocked <= 1.1 * base)} "
        f"| {blocked / base:.2f}x |",
        f"| blocked >= 10x less than S3 only | {_met(statistics.median(s3.blocked) >= 10 * blocked)}"
        f" | {statistics.median(s3.blocked) / blocked:.1f}x |",
        f"| S3 lags <= 1 epoch when the uplink outpaces the state | "
        f"{'not measurable: the uplink is slower here' if _uplink_slower(s3, args) else _met(max(tiered.lags) <= 1)} "
        f"| S3 save {statistics.median(s3.blocked):.1f} s per epoch against "
        f"{args.compute_seconds:g} s of compute; lag {max(tiered.lags)} |",
    ]
    return "\n".join(lines)


def _met(ok: bool) -> str:
    return "yes" if ok else "no"


def _uplink_slower(s3: Loop, args: argparse.Namespace) -> bool:
    """Whether a copy takes longer than an epoch (the lag target then cannot hold)."""
    return statistics.median(s3.blocked) > args.compute_seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--smoke", action="store_true", help="16 MiB, 3 epochs, loopback (CI)")
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--compute-seconds", type=float, default=3.0)
    parser.add_argument("--delay-ms", type=float, default=20.0)
    parser.add_argument("--mibps", type=float, default=250.0)
    parser.add_argument("--docs", action="store_true", help="also update docs/benchmarks-tables.md")
    args = parser.parse_args(argv)
    args.load = os.getloadavg()[0]
    if args.smoke:
        args.mib, args.epochs, args.compute_seconds = 16, 3, 0.2
    loops: list[Loop] = []
    rows: list[tuple[str, Callable[[str, str], list[str | CheckpointLocation]]]] = [
        ("local only", lambda local, endpoint: [local]),
        ("S3 only", lambda local, endpoint: [s3_root(endpoint)]),
        ("local then S3", lambda local, endpoint: [local, s3_root(endpoint)]),
    ]
    limits = ""
    for name, roots in rows:
        with server(args) as (endpoint, where), tempfile.TemporaryDirectory() as local:
            limits = where
            loop = run_loop(name, roots(f"{local}/run", endpoint), make_state(args.mib), args)
            loops.append(loop)
            print(f"{name}: median blocked {statistics.median(loop.blocked):.3f} s", flush=True)
    publish(table(loops, args, limits), "tiers", "tiers", smoke=args.smoke, docs=args.docs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
