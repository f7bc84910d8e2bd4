"""Local-disk benchmark: ckptstore against the tools users would pick instead.

    python -m benchmarks.local                       # 1 GiB mix, disk and /dev/shm
    python -m benchmarks.local --workload mixed-4g   # the 4 GiB variant
    python -m benchmarks.local --smoke               # seconds, in one process; what CI runs
    python -m benchmarks.local --docs                # also update docs/benchmarks-tables.md
    python -m benchmarks.local --sweep               # concurrency x chunk size, a run each
    python -m benchmarks.local --chunk-pairs 15      # chunk sizes alternating, 15 rounds

Every tool saves the same blobs durably (fsync or syncfs) and restores them, each
operation in a fresh process (so peak memory is the operation's own), repeated
``--repeat`` times (the median is reported). Before each restore from disk the page
cache is dropped when the process may do so (root), so restores read the device.
The table gives GiB/s, the ratio to the location's physical limit measured in the
same run (:mod:`benchmarks.limits`: the best of several parallel raw writers and
readers with fsync on disk, ``np.copyto`` in memory), ckptstore's ratio to each tool,
and the peak memory above the state. The targets under each table that a table's
medians of three cannot resolve on a shared machine are measured with both sides back
to back: the saves against safetensors and torch DCP in pairs (:func:`save_pairs`), the
disk save against the limit alternating with it (:func:`benchmarks.against_limit.rounds`)
and the checksum cost in pairs of restores (:func:`verify_cost`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import numpy as np

from benchmarks.against_limit import ratio_to_limit
from benchmarks.against_limit import rounds as alternate_with_limit
from benchmarks.bare_read import CHECKED as BARE_CHECKED
from benchmarks.bare_read import UNCHECKED as BARE
from benchmarks.limits import Limit, location_limit
from benchmarks.measure import Operation, measure, operation_for
from benchmarks.peers import ckptstore_load, ckptstore_save, remove, tools
from benchmarks.report import BENCHMARKS_PAGE, DOCS, update_docs_section
from benchmarks.system import (
    disk_usage,
    drop_caches,
    environment_variable,
    memory_kept,
    syncfs,
)
from benchmarks.workload import MIXES, MiB, make_workload, nbytes
from ckptstore.builtin import LocalPath
from ckptstore.io import crc32_of, usable_cpus

GiB = 1 << 30
T = TypeVar("T")

LIMIT = "physical limit"
OURS = "ckptstore zarr"
UNVERIFIED = "ckptstore zarr, no verify"
RESULTS = Path(__file__).resolve().parent / "results"


@dataclass
class Row:
    tool: str
    save: list[float] = field(default_factory=list)
    load: list[float] = field(default_factory=list)
    save_peak: int = 0
    load_peak: int = 0
    files: int = 0

    def save_rate(self, size: int) -> float:
        return size / statistics.median(self.save) / GiB

    def load_rate(self, size: int) -> float:
        return size / statistics.median(self.load) / GiB


def run_location(
    location: Path,
    workload: str,
    names: list[str],
    repeat: int,
    cold: bool,
    keep: bool,
    fresh: bool = True,
) -> dict[str, Row]:
    """Every tool, ``repeat`` times, interleaved (so drifts of a shared machine hit every
    tool). With ``keep``, checkpoints stay until the end: deleting thousands of files
    between runs would make the next run pay for the deletion (on disks mounted with
    ``discard``, freed blocks are trimmed at the next journal commits). The first row
    is the location's physical limit, measured once per repeat like the tools. Each
    save and load runs in a fresh process unless ``fresh`` is False (smoke runs)."""
    operation = operation_for(fresh)
    size = nbytes(make_workload(workload))
    rows = {LIMIT: Row(LIMIT), **{name: Row(name) for name in names}}
    written: list[Path] = []
    for _ in range(repeat):
        limit = location_limit(location, size)
        rows[LIMIT].save.append(limit.save.seconds)
        rows[LIMIT].load.append(limit.load.seconds)
        rows[LIMIT].tool = limit_label(limit)
        for name in names:
            target = Path(tempfile.mkdtemp(prefix="ckptbench-", dir=location))
            written.append(target)
            try:
                saved = operation(name, "save", workload, target)
                rows[name].files = disk_usage(target).files
                if cold:
                    drop_caches()
                loaded = operation(name, "load", workload, target)
            finally:
                if not keep:
                    remove(target)
            row = rows[name]
            row.save.append(saved["seconds"])
            row.load.append(loaded["seconds"])
            row.save_peak = max(row.save_peak, saved["peak_above_state"])
            row.load_peak = max(row.load_peak, max(0, loaded["peak_above_state"] - size))
    for target in written:
        remove(target)
    return rows


PAIRS = 9
"""How many times each save target measured back to back is taken: the pairs of saves
of :func:`save_pairs` and the rounds of :func:`benchmarks.against_limit.rounds` (the
checksum target's restores take :data:`CHECK_PAIRS`; the table's limit is the best of
about fifteen raw trials per repeat, so a burst of the disk caught by any one trial
lowers its ratio)."""
CHECK_PAIRS = 21
"""How many pairs of restores :func:`verify_cost` takes for the checksum target. A
restore from memory in a fresh process moves by a tenth or more from one process to the
next (its memory is new each time, and the VM's host backs it), so nine pairs put the
median of the same code anywhere from +7% to +13% (runs of 2026-11-26 and 27); restores
are cheap (a second each with the process), so the checksum target takes more of them
than the saves do."""
SAVE_PEERS = ("safetensors", "torch.distributed.checkpoint")
"""The peers whose saves the targets set ckptstore's against: each is also measured in
pairs (:func:`save_pairs`)."""


@dataclass
class PairedCost:
    """One pair of :func:`verify_cost`: how much slower the checked restore was than the
    unchecked one (``slower``, 0.1 for 10%) and the CPU time it added (``cpu_seconds``,
    every thread's user and system time); then the same for the bare read of the same
    files with and without a CRC-32 of each window (``bare_slower``,
    ``bare_cpu_seconds``; :mod:`benchmarks.bare_read`)."""

    slower: float
    cpu_seconds: float
    bare_slower: float
    bare_cpu_seconds: float


def spread(values: list[float]) -> str:
    """Where ``values`` (fractions) lie: their middle half, then all of them."""
    everything = f"{min(values):+.1%} to {max(values):+.1%}"
    if len(values) < 4:
        return everything
    lower, _, upper = statistics.quantiles(values, n=4)
    return f"middle half {lower:+.1%} to {upper:+.1%}, all {everything}"


def in_turn(round_number: int, *items: T) -> tuple[T, ...]:
    """The order of round ``round_number``'s operations: each round starts one further
    along, so that none always runs after the same other (for a pair: which goes first
    alternates)."""
    turn = round_number % len(items)
    return items[turn:] + items[:turn]


def verify_cost(
    location: Path, workload: str, pairs: int, cold: bool, fresh: bool = True
) -> list[PairedCost]:
    """What checking checksums adds to ckptstore zarr's restore, measured in pairs: one
    checkpoint restored with and without the check back to back (which goes first
    alternates), ``pairs`` times, each pair followed by a pair of bare reads of its
    files (:mod:`benchmarks.bare_read`: the same CRC-32 with no ckptstore code around
    it). A restore from memory varies by a third from one fresh process to the next, so
    the medians of the table's three rounds, taken apart, cannot resolve a 10%
    difference; pairs taken together can."""
    operation = operation_for(fresh)
    costs = []
    with saved_checkpoint(OURS, location, workload, operation) as target:
        # the first restore after the save pays for what is loaded once (in one process,
        # imports and caches; in any process, moving the file's pages to the kernel's
        # active list, which perf showed): not measured, or it would always count
        # against the first pair's checked restore, which goes first
        operation(UNVERIFIED, "load", workload, target)

        def paired(checked: str, unchecked: str, op: str, pair: int) -> tuple[float, float]:
            measured = {}
            for name in in_turn(pair, checked, unchecked):
                if cold:
                    drop_caches()
                measured[name] = operation(name, op, workload, target)
            on, off = measured[checked], measured[unchecked]
            return on["seconds"] / off["seconds"] - 1, on["cpu_seconds"] - off["cpu_seconds"]

        for pair in range(pairs):
            restore = paired(OURS, UNVERIFIED, "load", pair)
            costs.append(PairedCost(*restore, *paired(BARE_CHECKED, BARE, "bare-read", pair)))
    return costs


def save_pairs(
    location: Path, workload: str, peer: str, pairs: int, fresh: bool = True
) -> list[float]:
    """How many times faster ckptstore zarr saves ``workload`` to ``location`` than
    ``peer``, measured in pairs: the two saves back to back (which goes first
    alternates), ``pairs`` times, each ratio the peer's seconds over ckptstore's. Each
    checkpoint is removed, and the removal committed, before the next save (outside the
    clocks). The table's medians of three rounds, each tool's save minutes apart from
    the others', follow the disk's drift (a burst of this virtual disk moves a save by
    a fifth); two saves back to back see the same disk."""
    operation = operation_for(fresh)
    ratios = []
    for pair in range(pairs):
        seconds = {}
        for name in in_turn(pair, OURS, peer):
            target = Path(tempfile.mkdtemp(prefix="ckptbench-", dir=location))
            try:
                seconds[name] = operation(name, "save", workload, target)["seconds"]
            finally:
                remove(target)
                syncfs(location)
        ratios.append(seconds[peer] / seconds[OURS])
    return ratios


def checksum_cpu_per_gib(rounds: int = 5) -> float:
    """Seconds of CPU that ckptstore's CRC-32 (what a load checks) takes per GiB of
    bytes already in the CPU's cache (a 1 MiB buffer checksummed 1024 times; the best of
    ``rounds``): what checking a restore cannot cost less than, its bytes being checked
    right after they are read."""
    window = [np.random.default_rng(0).integers(0, 256, MiB, dtype=np.uint8)]
    best = float("inf")
    for _ in range(rounds):
        started = time.process_time()
        for _ in range(GiB // MiB):
            crc32_of(window)
        best = min(best, time.process_time() - started)
    return best


def least_checking_cost(checksum_seconds: float, unchecked_seconds: float) -> float:
    """How much slower than ``unchecked_seconds`` a restore checking every byte must be,
    at the least, when the checksums take ``checksum_seconds`` of CPU: their work spread
    over every CPU this process may use, overlapping nothing. Quoted for restores from
    memory only: those keep the CPUs busy copying, so the check's CPU time adds to them;
    a restore from disk waits for the device, and can hide the check in the wait."""
    return checksum_seconds / usable_cpus() / unchecked_seconds


@contextmanager
def saved_checkpoint(
    tool: str, location: Path, workload: str, operation: Operation
) -> Iterator[Path]:
    """A directory under ``location`` holding ``workload`` saved by ``tool``, removed
    afterwards."""
    target = Path(tempfile.mkdtemp(prefix="ckptbench-", dir=location))
    try:
        operation(tool, "save", workload, target)
        yield target
    finally:
        remove(target)


def limit_label(limit: Limit) -> str:
    """The limit's row label: which raw method was fastest each way."""
    if limit.save.method == limit.load.method:
        return f"{LIMIT}: {limit.save.method}"
    return f"{LIMIT}: {limit.save.method} / {limit.load.method}"


def partial_reads(location: Path, workload: str, fresh: bool = True) -> dict[str, int]:
    """Bytes read to load one ~1 MiB blob from each ckptstore format's checkpoint."""
    operation = operation_for(fresh)
    result = {}
    for name in (tool for tool in tools() if tool.startswith("ckptstore") and tool != UNVERIFIED):
        with saved_checkpoint(name, location, workload, operation) as target:
            result[name] = int(operation(name, "partial", workload, target)["bytes_read"])
    return result


def sweep(location: Path, workload: str, cold: bool) -> str:
    """zarr save and restore for each engine concurrency and chunk size: how the
    defaults (``LocalPath.default_io``) were chosen."""
    size = nbytes(make_workload(workload))
    lines = [
        "| concurrency | chunk MiB | save GiB/s | restore GiB/s |",
        "|---:|---:|---:|---:|",
    ]
    written = []
    for concurrency in (1, 2, 4, 8):
        for chunk in (4, 16, 64):
            env = {
                "CKPTSTORE_IO_CONCURRENCY": str(concurrency),
                "CKPTSTORE_IO_CHUNK_BYTES": str(chunk * MiB),
                "CKPTSTORE_IO_MEMORY_BUDGET": str(max(256, 4 * chunk) * MiB),
            }
            target = Path(tempfile.mkdtemp(prefix="ckptbench-", dir=location))
            written.append(target)
            saved = measure(OURS, "save", workload, target, env)
            if cold:
                drop_caches()
            loaded = measure(OURS, "load", workload, target, env)
            lines.append(
                f"| {concurrency} | {chunk} | {size / saved['seconds'] / GiB:.2f} "
                f"| {size / loaded['seconds'] / GiB:.2f} |"
            )
            if location.resolve().parts[:3] == ("/", "dev", "shm"):
                remove(target)
    for target in written:
        remove(target)
    return "\n".join(lines)


CHUNK_SIZES = (16, 32, 64)
"""MiB per chunk compared by :func:`chunk_pairs`."""


def chunk_pairs(location: Path, workload: str, rounds: int, cold: bool) -> str:
    """zarr save and restore with each chunk size of :data:`CHUNK_SIZES` (the path
    type's default concurrency), ``rounds`` rounds in one process, the sizes' order
    turned each round: medians, and each size's median ratio, round by round, to the
    default's (``LocalPath.default_io``; above 1: faster than the default). The sweep's
    single runs cannot tell chunk sizes apart on this disk; rounds side by side can."""
    blobs = make_workload(workload)
    default = LocalPath.default_io.chunk_bytes // MiB
    times: dict[tuple[int, str], list[float]] = {
        (size, step): [] for size in CHUNK_SIZES for step in ("save", "restore")
    }
    work = Path(tempfile.mkdtemp(prefix="ckptchunks-", dir=location))
    try:
        for number in range(rounds):
            for size in in_turn(number, *CHUNK_SIZES):
                target = work / "checkpoint"
                with environment_variable("CKPTSTORE_IO_CHUNK_BYTES", str(size * MiB)):
                    os.sync()
                    started = time.perf_counter()
                    ckptstore_save("zarr", blobs, target)
                    times[size, "save"].append(time.perf_counter() - started)
                    if cold:
                        drop_caches()
                    started = time.perf_counter()
                    ckptstore_load("zarr", blobs, target)
                    times[size, "restore"].append(time.perf_counter() - started)
                remove(target)
                syncfs(work)
    finally:
        remove(work)
    lines = [
        "| chunk MiB | save s | save, x default | restore s | restore, x default |",
        "|---:|---:|---:|---:|---:|",
    ]
    for size in CHUNK_SIZES:
        cells = []
        for step in ("save", "restore"):
            mine, base = times[size, step], times[default, step]
            paired = statistics.median(b / a for a, b in zip(mine, base, strict=True))
            cells.append(f"{statistics.median(mine):.3f} | {paired:.3f}")
        mark = " (default)" if size == default else ""
        lines.append(f"| {size}{mark} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table(rows: dict[str, Row], size: int) -> str:
    limit = rows.get(LIMIT)
    ours = rows.get(OURS)
    lines = [
        "| tool | save GiB/s | x limit | ckptstore zarr is | restore GiB/s | x limit "
        "| ckptstore zarr is | peak MiB above state (save / restore) | files |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows.values():
        save, load = row.save_rate(size), row.load_rate(size)
        save_limit = f"{save / limit.save_rate(size):.2f}" if limit else "-"
        load_limit = f"{load / limit.load_rate(size):.2f}" if limit else "-"
        save_vs = f"{ours.save_rate(size) / save:.2f}x" if ours and row is not ours else ""
        load_vs = f"{ours.load_rate(size) / load:.2f}x" if ours and row is not ours else ""
        lines.append(
            f"| {row.tool} | {save:.2f} | {save_limit} | {save_vs} | {load:.2f} | {load_limit} "
            f"| {load_vs} | {row.save_peak / MiB:.0f} / {row.load_peak / MiB:.0f} "
            f"| {row.files or ''} |"
        )
    return "\n".join(lines)


def targets(
    rows: dict[str, Row],
    size: int,
    partial: dict[str, int],
    memory: bool,
    checking: list[PairedCost] | None = None,
    checksum_cpu: float | None = None,
    saves: dict[str, list[float]] | None = None,
    alternating: dict[str, list[float]] | None = None,
) -> list[tuple[str, bool, str]]:
    """The targets of issues 3 and 12, each with whether it is met and the measured
    value (``memory``: the location is a tmpfs, where the safetensors target is 1.0x;
    ``checking``: the paired costs of :func:`verify_cost`, whose median is the
    checksum target's measure, quoted with the CPU the check added per GiB beside
    ``checksum_cpu``, :func:`checksum_cpu_per_gib`; ``saves``: the ratios of
    :func:`save_pairs` by peer, whose median is the measure of that peer's save
    target, quoted beside the table's ratio; ``alternating``: the times of
    :func:`benchmarks.against_limit.rounds`, the measure of the save's target against
    the limit, quoted beside the table's ratio)."""
    checks: list[tuple[str, bool, str]] = []
    ours = rows.get(OURS)
    if ours is None:
        return checks

    def ratio(name: str, what: str) -> float | None:
        other = rows.get(name)
        if other is None:
            return None
        if what == "save":
            return ours.save_rate(size) / other.save_rate(size)
        return ours.load_rate(size) / other.load_rate(size)

    for label, name, what, goal in (
        ("save >= 0.85x the physical limit", LIMIT, "save", 0.85),
        ("save >= 2.5x torch.distributed.checkpoint", "torch.distributed.checkpoint", "save", 2.5),
        (
            f"save >= {1.0 if memory else 0.9}x safetensors",
            "safetensors",
            "save",
            1.0 if memory else 0.9,
        ),
        ("restore >= 1.0x safetensors", "safetensors", "load", 1.0),
        ("restore >= 2x torch.distributed.checkpoint", "torch.distributed.checkpoint", "load", 2.0),
        ("restore >= 0.8x the physical limit", LIMIT, "load", 0.8),
        ("save >= 25x plain zarr-python", "zarr-python", "save", 25.0),
    ):
        value = ratio(name, what)
        paired = (saves or {}).get(name) if what == "save" else None
        if name == LIMIT and what == "save" and alternating:
            method, measured, _ = ratio_to_limit(alternating)
            rounds = min(map(len, alternating.values()))
            how = f"medians of {rounds} rounds alternating in one process with the limit's method, {method}"
            beside = "against this table's limit"
        elif paired:
            measured = statistics.median(paired)
            how = f"median of {len(paired)} paired saves, {min(paired):.2f}x to {max(paired):.2f}x"
            beside = "the table's medians"
        else:
            if value is not None:
                checks.append((label, value >= goal, f"{value:.2f}x"))
            continue
        quoted = f"; {beside}: {value:.2f}x" if value is not None else ""
        checks.append((label, measured >= goal, f"{measured:.2f}x ({how}{quoted})"))
    if checking:
        slower = [pair.slower for pair in checking]
        median = statistics.median(slower)
        cpu = statistics.median(pair.cpu_seconds for pair in checking) * GiB / size
        bare = statistics.median(pair.bare_slower for pair in checking)
        bare_cpu = statistics.median(pair.bare_cpu_seconds for pair in checking) * GiB / size
        floor = f", CRC-32 alone {checksum_cpu * 1000:.0f} ms" if checksum_cpu is not None else ""
        unchecked = rows.get(UNVERIFIED)
        if memory and checksum_cpu is not None and unchecked is not None and unchecked.load:
            least = least_checking_cost(
                checksum_cpu * size / GiB, statistics.median(unchecked.load)
            )
            floor += f"; the least any check of every byte adds here: {least:+.1%}"
        checks.append(
            (
                "checksums on < 10% slower than off (restore)",
                median < 0.10,
                f"{median:+.1%} (median of {len(checking)} paired restores, "
                f"{spread(slower)}; CPU the check added per GiB: "
                f"{cpu * 1000:.0f} ms{floor}; a bare read of the same files checked the "
                f"same way: {bare:+.1%}, {bare_cpu * 1000:.0f} ms)",
            )
        )
    for name, read in partial.items():
        checks.append(
            (
                f"partial load of one 1 MiB blob reads < 4 MiB ({name})",
                read < 4 * MiB,
                f"{read / MiB:.2f} MiB",
            )
        )
    return checks


def plot(results: dict[str, dict[str, Row]], size: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(results), figsize=(7 * len(results), 5), squeeze=False)
    for axis, (location, rows) in zip(axes[0], results.items(), strict=True):
        names = list(rows)
        positions = range(len(names))
        axis.barh(
            [p + 0.2 for p in positions],
            [rows[n].save_rate(size) for n in names],
            0.4,
            label="save (durable)",
        )
        axis.barh(
            [p - 0.2 for p in positions],
            [rows[n].load_rate(size) for n in names],
            0.4,
            label="restore",
        )
        axis.set_yticks(list(positions), names)
        axis.invert_yaxis()
        axis.set_xlabel("GiB/s (higher is better)")
        axis.set_title(location)
        axis.legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workload", default="mixed-1g", choices=MIXES)
    parser.add_argument(
        "--disk", default=str(RESULTS / "scratch"), help="directory on the real disk"
    )
    parser.add_argument("--shm", default="/dev/shm", help="directory in memory (tmpfs)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tools", nargs="*", help="subset of tools (default: all)")
    parser.add_argument("--smoke", action="store_true", help="tiny workload, one repeat, few tools")
    parser.add_argument("--docs", action="store_true", help="write the table and plot into docs/")
    parser.add_argument(
        "--sweep", action="store_true", help="only sweep ckptstore's concurrency and chunk size"
    )
    parser.add_argument(
        "--chunk-pairs",
        type=int,
        metavar="ROUNDS",
        help="only compare chunk sizes, alternating in one process, this many rounds",
    )
    args = parser.parse_args(argv)
    with memory_kept(not args.smoke) as memory:
        if args.chunk_pairs:
            Path(args.disk).mkdir(parents=True, exist_ok=True)
            cold = drop_caches()
            text = "\n".join(
                [
                    f"`python -m benchmarks.local --chunk-pairs {args.chunk_pairs}`: workload "
                    f"`{args.workload}`, ckptstore zarr. {memory}".rstrip(),
                    "",
                    f"**disk ({args.disk}; restores {'cold' if cold else 'warm'})**",
                    "",
                    chunk_pairs(Path(args.disk), args.workload, args.chunk_pairs, cold),
                    "",
                    f"**memory ({args.shm})**",
                    "",
                    chunk_pairs(Path(args.shm), args.workload, args.chunk_pairs, False),
                ]
            )
            print(text)
            if args.docs:
                update_docs_section(BENCHMARKS_PAGE, "local-chunk-pairs", text)
            return 0
        if args.sweep:
            Path(args.disk).mkdir(parents=True, exist_ok=True)
            cold = drop_caches()
            text = "\n".join(
                [
                    f"Workload `{args.workload}`, ckptstore zarr, one run per cell. {memory}".rstrip(),
                    "",
                    f"**disk ({args.disk})**",
                    "",
                    sweep(Path(args.disk), args.workload, cold),
                    "",
                    f"**memory ({args.shm})**",
                    "",
                    sweep(Path(args.shm), args.workload, False),
                ]
            )
            print(text)
            if args.docs:
                update_docs_section(BENCHMARKS_PAGE, "local-sweep", text)
            return 0

        names = args.tools or list(tools())
        if args.smoke:
            args.workload, args.repeat = "tiny", 1
            smoke = (OURS, UNVERIFIED, "ckptstore npz", "np.savez", "torch.distributed.checkpoint")
            names = [n for n in names if n in smoke]
        size = nbytes(make_workload(args.workload))
        Path(args.disk).mkdir(parents=True, exist_ok=True)
        cold = drop_caches()
        disk, shm = f"disk ({args.disk})", f"memory ({args.shm})"
        results = {
            disk: run_location(
                Path(args.disk), args.workload, names, args.repeat, cold, True, not args.smoke
            ),
            shm: run_location(
                Path(args.shm), args.workload, names, args.repeat, False, False, not args.smoke
            ),
        }
        partial = partial_reads(Path(args.shm), args.workload, not args.smoke)
        locations = ((disk, args.disk, cold), (shm, args.shm, False))
        pairs = 1 if args.smoke else PAIRS
        check_pairs = 1 if args.smoke else CHECK_PAIRS
        checking: dict[str, list[PairedCost]] = {}
        checksum_cpu = None
        if OURS in names and UNVERIFIED in names:
            checksum_cpu = checksum_cpu_per_gib(1 if args.smoke else 5)
            for location, root, location_cold in locations:
                checking[location] = verify_cost(
                    Path(root), args.workload, check_pairs, location_cold, not args.smoke
                )
        saves: dict[str, dict[str, list[float]]] = {}
        alternating: dict[str, dict[str, list[float]]] = {}
        if OURS in names:
            alternating[disk] = alternate_with_limit(Path(args.disk), args.workload, pairs)
            for location, root, _ in locations:
                saves[location] = {
                    peer: save_pairs(Path(root), args.workload, peer, pairs, not args.smoke)
                    for peer in SAVE_PEERS
                    if peer in names
                }
        report = [
            f"Workload `{args.workload}`: {size / GiB:.2f} GiB in {len(make_workload(args.workload))} blobs; "
            f"median of {args.repeat}; restores from disk {'cold (page cache dropped)' if cold else 'warm'}. "
            f"{memory}".rstrip()
        ]
        for location, rows in results.items():
            report += ["", f"**{location}**", "", table(rows, size)]
            memory_location = location.startswith("memory")
            checks = targets(
                rows,
                size,
                partial,
                memory_location,
                checking.get(location),
                checksum_cpu,
                saves.get(location),
                alternating.get(location),
            )
            if checks:
                report += ["", "| target | met | measured |", "|---|---|---|"]
                report += [
                    f"| {label} | {'yes' if ok else 'NO'} | {value} |"
                    for label, ok, value in checks
                ]
        text = "\n".join(report)
        print(text)
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / f"local-{args.workload}.md").write_text(text + "\n")
        (RESULTS / f"local-{args.workload}.json").write_text(
            json.dumps(
                {loc: {n: r.__dict__ for n, r in rows.items()} for loc, rows in results.items()},
                indent=1,
            )
        )
        if args.docs:
            image = f"benchmarks-local-{args.workload}.png"
            plot(results, size, DOCS / image)
            update_docs_section(
                BENCHMARKS_PAGE,
                f"local-{args.workload}",
                text + f"\n\n![{args.workload}]({image})",
            )
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
