"""ckptstore's disk save against the disk's limit, the two alternating in one process.

The 1 GiB table of :mod:`benchmarks.local` sets each tool's median save against the
best of about fifteen raw trials made once per repeat: on this virtual disk, whose
speed moves from minute to minute (docs/benchmarks.md, "Reading these numbers"), a
burst caught by any one trial lowers every "x limit" of the run. Here the limit's
methods (one preallocated file, 1 or 2 threads, 64 MiB ``pwrite`` ``O_DIRECT``, then
fsync: the methods that won every limits run on this disk) write as many bytes as
ckptstore's save of the workload, alternating with that save, ``--repeat`` rounds in
one process, so drift hits both alike. Each round also replays the writes of one
ckptstore save recorded before the rounds (:mod:`benchmarks.replay`: the same files,
offsets, lengths and threads, ``O_DIRECT`` or not, with no work around them). Reported:
each round, the medians, ckptstore's median against the faster method's median (and
best against best), and that ratio taken apart: the replay against the limit (what the
layout costs) and ckptstore's save against its replay (what the process around the
writes costs).

    python -m benchmarks.against_limit            # the 1 GiB mix, 9 rounds, the disk
    python -m benchmarks.against_limit --smoke    # a tiny mix, 2 rounds (CI)
    python -m benchmarks.against_limit --docs     # also write docs/benchmarks-tables.md's section
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.limits import (
    clear_trial,
    one_file_method,
    page_aligned,
    source_bytes,
    write_one_file,
)
from benchmarks.peers import ckptstore_save, remove
from benchmarks.replay import record, replay, source_for
from benchmarks.report import RESULTS, publish
from benchmarks.system import memory_kept, syncfs
from benchmarks.workload import MiB, make_workload, nbytes

METHODS = {one_file_method(threads, 64 * MiB, direct=True): threads for threads in (1, 2)}
OURS = "ckptstore zarr save"
REPLAY = "its writes replayed"
TARGET = 0.85


def rounds(location: Path, workload: str, repeat: int) -> dict[str, list[float]]:
    """``repeat`` rounds of ckptstore's save, each limit method and the replay of a save's
    writes recorded first (:data:`REPLAY`), in that order: the seconds of each. A save's
    checkpoint is deleted, and the deletion committed, before the raw writers run
    (outside every clock); so are the replay's files before the next round."""
    blobs = make_workload(workload)
    source = page_aligned(source_bytes(nbytes(blobs))).data
    times: dict[str, list[float]] = {OURS: [], **{method: [] for method in METHODS}, REPLAY: []}
    work = Path(tempfile.mkdtemp(prefix="ckptagainst-", dir=location))
    try:
        recorded = work / "recorded"
        writes = record(lambda: ckptstore_save("zarr", blobs, recorded))
        remove(recorded)
        syncfs(work)
        replay_source = source_for(writes)
        for _ in range(repeat):
            target = work / "checkpoint"
            os.sync()
            started = time.perf_counter()
            ckptstore_save("zarr", blobs, target)
            times[OURS].append(time.perf_counter() - started)
            remove(target)
            syncfs(work)
            for method, threads in METHODS.items():
                times[method].append(
                    write_one_file(work / "raw.bin", source, threads, 64 * MiB, direct=True)
                )
                clear_trial(work)
            times[REPLAY].append(replay(writes, work / "replay", replay_source))
            remove(work / "replay")
            syncfs(work)
    finally:
        remove(work)
    return times


def ratio_to_limit(times: dict[str, list[float]]) -> tuple[str, float, float]:
    """From :func:`rounds`' times: the limit (the method with the faster median), the
    ratio of its median to ckptstore's, and the best round's ratio to ckptstore's best."""
    medians = {name: statistics.median(values) for name, values in times.items()}
    limit = min(METHODS, key=lambda method: medians[method])
    best = min(min(times[method]) for method in METHODS) / min(times[OURS])
    return limit, medians[limit] / medians[OURS], best


def report(times: dict[str, list[float]], size: int) -> list[str]:
    """The rounds, the medians, and the ratio with its target."""
    names = list(times)
    lines = [
        "| round | " + " | ".join(f"{name} s" for name in names) + " |",
        "|---:|" + "---:|" * len(names),
    ]
    for index in range(len(times[OURS])):
        lines.append(
            f"| {index + 1} | " + " | ".join(f"{times[name][index]:.3f}" for name in names) + " |"
        )
    medians = {name: statistics.median(values) for name, values in times.items()}
    lines.append("| median | " + " | ".join(f"{medians[name]:.3f}" for name in names) + " |")
    lines.append(
        "| median GiB/s | "
        + " | ".join(f"{size / medians[name] / 2**30:.2f}" for name in names)
        + " |"
    )
    limit, ratio, best = ratio_to_limit(times)
    lines += [
        "",
        "| target (issue 12) | met | measured |",
        "|---|---|---|",
        f"| save >= {TARGET}x the physical limit (medians, alternating; the limit: {limit}) "
        f"| {'yes' if ratio >= TARGET else 'NO'} | {ratio:.2f}x |",
        f"| the same, best round against best round | {'yes' if best >= TARGET else 'NO'} "
        f"| {best:.2f}x |",
    ]
    if REPLAY not in times:
        return lines
    return [
        *lines,
        "",
        "| the ratio taken apart (medians) | measured |",
        "|---|---|",
        f"| the layout: ckptstore's writes replayed, against the limit | "
        f"{medians[limit] / medians[REPLAY]:.2f}x |",
        f"| the process: ckptstore's save against its writes replayed | "
        f"{medians[REPLAY] / medians[OURS]:.2f}x |",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--disk", default=str(RESULTS / "scratch"), help="directory on disk")
    parser.add_argument("--workload", default="mixed-1g")
    parser.add_argument("--repeat", type=int, default=9, help="rounds")
    parser.add_argument("--smoke", action="store_true", help="a tiny mix, 2 rounds")
    parser.add_argument("--docs", action="store_true", help="write the table into docs/")
    args = parser.parse_args(argv)
    if args.smoke:
        args.workload, args.repeat = "tiny", 2
    directory = Path(args.disk)
    directory.mkdir(parents=True, exist_ok=True)
    with memory_kept(not args.smoke) as memory:
        times = rounds(directory, args.workload, args.repeat)
        size = nbytes(make_workload(args.workload))
        head = (
            f"`python -m benchmarks.against_limit{' --smoke' if args.smoke else ''}`: "
            f"workload `{args.workload}` ({size / 2**30:.2f} GiB), {args.repeat} rounds "
            f"alternating in one process, to {directory}. {memory}"
        ).rstrip()
        publish(
            "\n".join([head, "", *report(times, size)]),
            "against_limit",
            "against-limit",
            smoke=args.smoke,
            docs=args.docs,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
