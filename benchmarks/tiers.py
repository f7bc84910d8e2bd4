"""Tiers: a training loop saving to S3 only, against local disk then S3 in the background.

A loop of ``--epochs`` epochs (10) of fixed compute (numpy matmuls for
``--compute-seconds``, then an in-place update of every blob, as an optimizer step)
saving ``--mib`` MiB (512) of float32 state after every epoch, each row against a fresh
moto server in a network namespace with ``--delay-ms`` (20) added per packet and a
bandwidth cap of ``--mibps`` MiB/s (250; netem's ``delay`` and ``rate``, from
:class:`benchmarks.network.NetworkNamespace`). Rows:

* ``local only``: ``CheckpointManager("/tmp/...")``, the speed the fast tier gives (run
  first and again last, to show how much the machine's load moved meanwhile);
* ``S3 only``: ``CheckpointManager("s3://bench/run")``, synchronous saves;
* ``local then S3``: ``CheckpointManager(["/tmp/...", "s3://bench/run"])``: saves commit
  on local disk, the S3 copy runs in the background (:mod:`ckptstore.checkpoint._tiers`),
  on a thread of the training process (the default);
* ``..., copy thread at nice 19``: the same, ``manager.tiers.copy_niceness = 19``;
* ``..., copy in a process``: ``manager.tiers.copy_in_process = True`` (its own GIL);
* ``..., copy in a process at nice 19``: both;
* ``..., paused during saves``: ``manager.tiers.pause_during_saves = True`` (the copy's
  process is stopped while a save runs);
* ``..., server at nice 19``: the default copy, with the moto server (and the latency
  relay) at nice 19: in production the object store runs on other machines, and a
  server that yields the CPU to the training is the closer model of that;
* ``local only, save_async``, ``local then S3, save_async`` and ``..., copy in a
  process, paused during saves, save_async``: ``manager.save_async``, which returns once
  the state is copied into staging buffers (the write, the commit and the copy's start
  follow in the background; the pause lasts while the state is copied); these rows are
  judged against the local-only ``save_async`` loop;
* ``local then local, save_async``: the copy goes to a second root on the local disk,
  not to moto (whose process shares the 2 cores and the memory).

moto keeps its objects in memory (``--moto-on-disk``: in temporary files, its default):
a remote store does not write to the disk the local saves use.

Reported: time blocked per save (median), the loop's wall time (including, for the
tiered rows, the wait at the end until S3 holds the last epoch), and the durable tier's
lag: how many epochs S3 was behind the local root right after each save returned (1 is
the least possible: the copy of the epoch just saved has only started; after a
``save_async``, the epoch just staged counts though its write is still running).

    python -m benchmarks.tiers           # full run: benchmarks/results/tiers.md
    python -m benchmarks.tiers --lag     # 32 MiB per epoch, 8 s compute: the uplink outpaces the state
    python -m benchmarks.tiers --rows "local only;local then S3"   # a subset
    python -m benchmarks.tiers --rounds 3   # the rows in turn, 3 times: drift hits all alike
    python -m benchmarks.tiers --smoke   # 16 MiB, 3 epochs, loopback moto (CI, < 60 s)
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks.network import NetworkNamespace
from benchmarks.object_store import KEY, SECRET, delayed_server, loopback_server, moto_storage
from benchmarks.report import publish
from benchmarks.system import memory_kept
from ckptstore import LocalSession, Node
from ckptstore.checkpoint import CheckpointManager
from ckptstore.protocol import CheckpointLocation

MiB = 1 << 20
BLOB_MIB = 32


@dataclass(frozen=True)
class Row:
    """One loop's set-up: roots, where and how the copy runs, the server's priority."""

    name: str
    local: bool = True
    s3: bool = False
    in_process: bool = False
    copy_niceness: int = 0
    server_niceness: int = 0
    pause: bool = False
    async_save: bool = False
    second_local: bool = False
    """A second root on the local disk instead of S3 (the copy without the fake S3)."""

    @property
    def local_alone(self) -> bool:
        """Saves to the local disk and nowhere else: what the other rows are judged by."""
        return self.local and not self.s3 and not self.second_local


ROWS = [
    Row("local only"),
    Row("S3 only", local=False, s3=True),
    Row("local then S3", s3=True),
    Row("local then S3, copy thread at nice 19", s3=True, copy_niceness=19),
    Row("local then S3, copy in a process", s3=True, in_process=True),
    Row("local then S3, copy in a process at nice 19", s3=True, in_process=True, copy_niceness=19),
    Row("local then S3, server at nice 19", s3=True, server_niceness=19),
    Row(
        "local then S3, copy in a process, paused during saves",
        s3=True,
        in_process=True,
        pause=True,
    ),
    Row(
        "local then S3, copy in a process at nice 19, paused during saves",
        s3=True,
        in_process=True,
        copy_niceness=19,
        pause=True,
    ),
    Row("local only, again", local=True),
    Row("local only, save_async", async_save=True),
    Row("local then S3, save_async", s3=True, async_save=True),
    Row(
        "local then S3, copy in a process, paused during saves, save_async",
        s3=True,
        in_process=True,
        pause=True,
        async_save=True,
    ),
    Row("local then local, save_async", second_local=True, async_save=True),
]
BY_NAME = {row.name: row for row in ROWS}
LAG_ROWS = [
    "local only",
    "S3 only",
    "local then S3",
    "local then S3, copy in a process, paused during saves",
]


@dataclass(frozen=True)
class Loop:
    name: str
    blocked: list[float]
    wall: float
    lags: list[int]
    copies: list[float]
    """Seconds each background copy took (upload, then the read-back verification)."""
    round: int = 0
    """Which pass over the rows (``--rounds``) ran this loop."""


def merged(loops: list[Loop]) -> list[Loop]:
    """One loop per row name, in first-run order: the saves, lags and copies of all its
    rounds together, the median wall time."""
    names = list(dict.fromkeys(loop.name for loop in loops))
    result = []
    for name in names:
        runs = [loop for loop in loops if loop.name == name]
        result.append(
            Loop(
                name,
                [seconds for loop in runs for seconds in loop.blocked],
                statistics.median(loop.wall for loop in runs),
                [lag for loop in runs for lag in loop.lags],
                [seconds for loop in runs for seconds in loop.copies],
            )
        )
    return result


def local_saves(loops: list[Loop], name: str) -> list[float]:
    """The blocked times row ``name`` is judged against: every save of the local-only
    loops saving the same way (``save`` or ``save_async``)."""
    judged = BY_NAME[name]
    return [
        seconds
        for loop in loops
        if BY_NAME[loop.name].local_alone and BY_NAME[loop.name].async_save == judged.async_save
        for seconds in loop.blocked
    ]


def round_ratios(loops: list[Loop], name: str) -> list[float]:
    """For each round: the median blocked time of row ``name`` against that round's
    local-only saves (the baseline nearest in time)."""
    ratios = []
    for number in sorted({loop.round for loop in loops}):
        this_round = [loop for loop in loops if loop.round == number]
        local = local_saves(this_round, name)
        rows = [loop for loop in this_round if loop.name == name]
        if local and rows:
            ratios.append(statistics.median(rows[0].blocked) / statistics.median(local))
    return ratios


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
    row: Row,
    roots: list[str | CheckpointLocation],
    state: dict[str, Any],
    args: argparse.Namespace,
    number: int = 0,
) -> Loop:
    session = LocalSession()
    session.workspace("trainer_0").update(state)
    manager = CheckpointManager(roots, "trainer_0", "zarr")
    if manager.tiers is not None:
        manager.tiers.copy_in_process = row.in_process
        manager.tiers.copy_niceness = row.copy_niceness
        manager.tiers.pause_during_saves = row.pause
    with Node("trainer_0"):
        session.run(manager.init(["trainer_0"]))
    blocked: list[float] = []
    lags: list[int] = []
    copies = CopyTimes()
    logging.getLogger("ckptstore.checkpoint._tiers").addHandler(copies)
    logging.getLogger("ckptstore.checkpoint._tiers").setLevel(logging.INFO)
    started = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        compute(session.workspace("trainer_0"), args.compute_seconds)  # type: ignore[arg-type]
        before = time.perf_counter()
        if row.async_save:
            manager.save_async(epoch, session)  # returns once the state is copied
        else:
            session.run(manager.save(epoch))
        blocked.append(time.perf_counter() - before)
        if manager.tiers is not None:
            copied = next(iter(manager.tiers.newest_copied().values()))
            lags.append(epoch - (copied or 0))
    manager.wait_for_saves()
    if manager.tiers is not None:
        manager.tiers.ensure(args.epochs, ["trainer_0"])
    logging.getLogger("ckptstore.checkpoint._tiers").removeHandler(copies)
    return Loop(row.name, blocked, time.perf_counter() - started, lags, copies.seconds, number)


class CopyTimes(logging.Handler):
    """Collects the duration of each background copy from the tiers' log."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seconds: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg.startswith("Copied epoch") and isinstance(record.args, tuple):
            self.seconds.append(float(record.args[-1]))


@contextlib.contextmanager
def server(args: argparse.Namespace, niceness: int = 0) -> Iterator[tuple[str, str]]:
    """A fresh moto server (and relay) at ``niceness``: (endpoint, what limits it).

    moto keeps its objects in memory unless ``--moto-on-disk``: a remote store does not
    write to the disk the local saves use, and moto's temporary files there (each object
    over 5 MiB) were flushed by the kernel while later saves ran."""
    in_memory = not args.moto_on_disk
    where = moto_storage(in_memory)
    if args.smoke:
        with loopback_server(niceness, in_memory=in_memory) as endpoint:
            yield endpoint, f"loopback, no limits, {where}"
        return
    with NetworkNamespace("tiers", delay_ms=args.delay_ms, rate_mibps=args.mibps) as network:
        delay = (
            f"+{args.delay_ms:g} ms per packet (netem)"
            if network.netem
            else f"+{args.delay_ms:g} ms per request (user-space relay: no netem here)"
        )
        cap = "netem rate" if network.netem else "tbf on both ends of the veth pair"
        limits = f"{delay}, {args.mibps:g} MiB/s cap ({cap}), {where}"
        port = 9000 + int(time.time()) % 500
        with delayed_server(
            network, args.delay_ms, port, niceness, in_memory=in_memory
        ) as endpoint:
            yield endpoint, limits


def s3_root(endpoint: str) -> CheckpointLocation:
    options = {"endpoint_url": endpoint, "key": KEY, "secret": SECRET, "region": "us-east-1"}
    return CheckpointLocation.open("s3://bench/run", "zarr", storage_options=options)


def table(runs: list[Loop], args: argparse.Namespace, limits: str) -> str:
    loops = merged(runs)
    by_name = {loop.name: loop for loop in loops}
    s3 = by_name.get("S3 only")
    bases = {
        loop.name: statistics.median(local) if (local := local_saves(loops, loop.name)) else None
        for loop in loops
    }
    s3_blocked = statistics.median(s3.blocked) if s3 else None
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    command = " ".join(["python -m benchmarks.tiers", *args.argv])
    lines = [
        f"`{command}`, {when}, load average {args.load:.1f} at the start (2 CPUs shared "
        f"with other work). {args.epochs} epochs of {args.compute_seconds:g} s compute, "
        f"{args.mib} MiB of state saved after each; moto S3: {limits}. {args.memory}".rstrip()
        + (
            f" {args.rounds} rounds: the rows ran in turn {args.rounds} times; each row's "
            "saves of every round together."
            if args.rounds > 1
            else ""
        ),
        "",
        "| loop | blocked per save (median) | vs local only (all its runs) | vs S3 only | loop wall time "
        "| S3 lag, epochs (median / max) | one copy (median) |",
        "|---|---|---|---|---|---|---|",
    ]
    for loop in loops:
        median = statistics.median(loop.blocked)
        lag = (
            f"{statistics.median(loop.lags):g} / {max(loop.lags)}"
            if loop.lags
            else ("0 (synchronous)" if loop.name == "S3 only" else "-")
        )
        base = bases[loop.name]
        versus_local = f"{median / base:.2f}x" if base else "-"
        versus_s3 = f"{s3_blocked / median:.1f}x less" if s3_blocked else "-"
        copy = f"{statistics.median(loop.copies):.1f} s" if loop.copies else "-"
        lines.append(
            f"| {loop.name} | {median:.3f} s | {versus_local} | {versus_s3} "
            f"| {loop.wall:.1f} s | {lag} | {copy} |"
        )
    lines += ["", "| target (issue 41) | met | measured |", "|---|---|---|"]
    tiered = [loop for loop in loops if loop.lags]
    for loop in tiered:  # against the local-only saves of the same way of saving
        base, median = bases[loop.name], statistics.median(loop.blocked)
        if base:
            measured = f"{median / base:.2f}x"
            if args.rounds > 1:
                each = ", ".join(f"{ratio:.2f}x" for ratio in round_ratios(runs, loop.name))
                measured += f" (each round against its own local-only saves: {each})"
            lines.append(
                f"| blocked <= 1.1x local only: {loop.name} | {_met(median <= 1.1 * base)} "
                f"| {measured} |"
            )
    for loop in tiered if s3_blocked else []:
        median = statistics.median(loop.blocked)
        lines.append(
            f"| blocked >= 10x less than S3 only: {loop.name} "
            f"| {_met(s3_blocked >= 10 * median)} | {s3_blocked / median:.1f}x |"
        )
    for loop in tiered:
        epoch_seconds = args.compute_seconds + statistics.median(loop.blocked)
        copy_seconds = statistics.median(loop.copies) if loop.copies else None
        if copy_seconds is None:
            verdict = "not measurable: no copy ended during the loop"
        elif copy_seconds > epoch_seconds:
            verdict = "not measurable: a copy takes longer than an epoch here"
        else:
            verdict = _met(max(loop.lags) <= 1)
        copies = f"one copy {copy_seconds:.1f} s, " if copy_seconds is not None else ""
        lines.append(
            f"| S3 lags <= 1 epoch when the uplink outpaces the state: {loop.name} | {verdict} "
            f"| {copies}one epoch {epoch_seconds:.1f} s; lag median "
            f"{statistics.median(loop.lags):g}, max {max(loop.lags)} |"
        )
    return "\n".join(lines)


def _met(ok: bool) -> str:
    return "yes" if ok else "no"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--smoke", action="store_true", help="16 MiB, 3 epochs, loopback (CI)")
    parser.add_argument(
        "--lag",
        action="store_true",
        help="32 MiB per epoch and 8 s of compute (the uplink outpaces the state), "
        "4 rows; published as the tiers-lag section",
    )
    parser.add_argument("--mib", type=int, default=None, help="MiB of state (512; --lag: 32)")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument(
        "--compute-seconds", type=float, default=None, help="per epoch (3; --lag: 8)"
    )
    parser.add_argument("--delay-ms", type=float, default=20.0)
    parser.add_argument("--mibps", type=float, default=250.0)
    parser.add_argument(
        "--moto-on-disk",
        action="store_true",
        help="let moto keep objects over 5 MiB in temporary files (its default, and the "
        "setting of every run published before 2026-11-28 23:50 UTC)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run the rows in turn this many times (the machine's drift between loops "
        "falls on every row alike)",
    )
    parser.add_argument(
        "--rows", default=None, help='row names separated by ";" (default: all; --lag: 4)'
    )
    parser.add_argument("--docs", action="store_true", help="also update docs/benchmarks-tables.md")
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    args.load = os.getloadavg()[0]
    if args.smoke:
        args.mib, args.epochs, args.compute_seconds = 16, 3, 0.2
    default_mib, default_compute = (32, 8.0) if args.lag else (512, 3.0)
    args.mib = default_mib if args.mib is None else args.mib
    args.compute_seconds = default_compute if args.compute_seconds is None else args.compute_seconds
    wanted = (
        args.rows.split(";")
        if args.rows
        else (LAG_ROWS if args.lag else [row.name for row in ROWS])
    )
    unknown = set(wanted) - {row.name for row in ROWS}
    if unknown:
        parser.error(f"unknown rows {sorted(unknown)}; rows: {[row.name for row in ROWS]}")
    loops: list[Loop] = []
    limits = ""
    selected = [row for row in ROWS if row.name in wanted]
    with memory_kept(not args.smoke) as args.memory:
        for number, row in ((n, row) for n in range(args.rounds) for row in selected):
            with (
                server(args, row.server_niceness) as (endpoint, where),
                tempfile.TemporaryDirectory() as local,
            ):
                limits = where
                roots: list[str | CheckpointLocation] = [f"{local}/run"] if row.local else []
                roots += [s3_root(endpoint)] if row.s3 else []
                roots += [f"{local}/second"] if row.second_local else []
                loop = run_loop(row, roots, make_state(args.mib), args, number)
                loops.append(loop)
                print(
                    f"round {number + 1}, {row.name}: median blocked {statistics.median(loop.blocked):.3f} s",
                    flush=True,
                )
    name = "tiers-lag" if args.lag else "tiers"
    publish(
        table(loops, args, limits), name.replace("-", "_"), name, smoke=args.smoke, docs=args.docs
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
