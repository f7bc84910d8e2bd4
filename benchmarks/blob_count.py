"""Blob-count scaling: what each blob and each file costs.

Workloads: 1,000, 10,000 and 50,000 float32 blobs of 4 KiB, and GPT-2 small with
Adam's state (592 tensors, 1.39 GiB; :mod:`benchmarks.workload`), on ``/dev/shm`` and
on the real disk. For each ckptstore format (zarr, npz, lmdb when its plugin is
installed) and each installed peer: durable save and load time (each in a fresh
process, median of ``--repeat``; disk loads cold when the page cache can be dropped),
seconds per 1,000 blobs, files per checkpoint, and the bytes the file system allocated
(``st_blocks * 512`` summed) against the bytes stored (the state's own size). Ratios
are peer time / ckptstore zarr time (> 1: ckptstore is faster).

    python -m benchmarks.blob_count             # everything (long: zarr-python and
                                                # tensorstore write a file per blob)
    python -m benchmarks.blob_count --smoke     # 100 blobs and a tiny GPT-2, in one
                                                # process, seconds (CI)
    python -m benchmarks.blob_count --docs      # also write docs/benchmarks-tables.md's section
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.limits import is_memory
from benchmarks.measure import operation_for
from benchmarks.peers import remove, tools
from benchmarks.report import RESULTS, publish
from benchmarks.system import DiskUsage, disk_usage, drop_caches, memory_kept
from benchmarks.workload import BLOB_COUNTS, MiB, make_workload, nbytes

OURS = "ckptstore zarr"
WORKLOADS = (*(f"blobs-{count}" for count in BLOB_COUNTS), "gpt2-adam")
SMOKE_WORKLOADS = ("blobs-100", "gpt2-adam-tiny")
SMOKE_TOOLS = ("ckptstore zarr", "ckptstore npz", "safetensors", "np.savez")
TARGET_WORKLOAD = "blobs-10000"


@dataclass
class Result:
    """One tool on one workload at one location."""

    tool: str
    blobs: int
    stored: int
    save: list[float] = field(default_factory=list)
    load: list[float] = field(default_factory=list)
    usage: DiskUsage | None = None

    @property
    def save_s(self) -> float:
        return statistics.median(self.save)

    @property
    def load_s(self) -> float:
        return statistics.median(self.load)


def run_workload(
    location: Path, workload: str, names: list[str], repeat: int, fresh: bool = True
) -> list[Result]:
    """Every tool ``repeat`` times, interleaved. On disk, checkpoints are deleted at the
    end (not between runs, so no run pays for the write-back and discards of the
    previous one's deletion); in memory (``/dev/shm``) after each round of every tool,
    since the rounds of a large workload would not fit (GPT-2 + Adam: 7 tools x 3
    rounds x 1.4 GiB). Each save and load runs in a fresh process, unless ``fresh`` is
    False (smoke runs: starting a process that loads every plugin costs more than the
    operation)."""
    operation = operation_for(fresh)
    blobs = make_workload(workload)
    results = {name: Result(name, len(blobs), nbytes(blobs)) for name in names}
    cold = not is_memory(location)
    written: list[Path] = []
    try:
        for _ in range(repeat):
            if not cold:
                while written:
                    remove(written.pop())
            for name in names:
                target = Path(tempfile.mkdtemp(prefix="ckptblobs-", dir=location))
                written.append(target)
                result = results[name]
                result.save.append(operation(name, "save", workload, target)["seconds"])
                result.usage = disk_usage(target)
                if cold:
                    drop_caches()
                result.load.append(operation(name, "load", workload, target)["seconds"])
                print(
                    f"  {location} {workload} {name}: save {result.save[-1]:.3f} s, "
                    f"load {result.load[-1]:.3f} s, {result.usage.files} files",
                    flush=True,
                )
    finally:
        for target in written:
            remove(target)
    return list(results.values())


def _ratio(ours: Result | None, other: Result, which: str) -> str:
    if ours is None or ours is other:
        return ""
    if which == "save":
        return f"{other.save_s / ours.save_s:.2f}x"
    return f"{other.load_s / ours.load_s:.2f}x"


def table(results: list[Result]) -> str:
    ours = next((result for result in results if result.tool == OURS), None)
    lines = [
        "| tool | save s | load s | save s / 1,000 blobs | load s / 1,000 blobs | files "
        "| allocated MiB | stored MiB | allocated / stored | save: peer / ckptstore zarr "
        "| load: peer / ckptstore zarr |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for result in results:
        usage = result.usage or DiskUsage(0, 0, 0, 0)
        per_thousand = 1000 / result.blobs
        lines.append(
            f"| {result.tool} | {result.save_s:.3f} | {result.load_s:.3f} "
            f"| {result.save_s * per_thousand:.4f} | {result.load_s * per_thousand:.4f} "
            f"| {usage.files} | {usage.allocated / MiB:.1f} | {result.stored / MiB:.1f} "
            f"| {usage.allocated / result.stored:.2f} | {_ratio(ours, result, 'save')} "
            f"| {_ratio(ours, result, 'load')} |"
        )
    return "\n".join(lines)


def targets(results: list[Result]) -> list[str]:
    """Issue 12's per-blob targets (on 10,000 x 4 KiB) as table rows."""
    by_tool = {result.tool: result for result in results}
    reference = by_tool.get("safetensors")
    rows = []
    for result in results:
        if not result.tool.startswith("ckptstore") or "verify" in result.tool:
            continue
        usage = result.usage or DiskUsage(0, 0, 0, 0)
        checks = [
            ("files per node checkpoint <= 16", usage.files <= 16, f"{usage.files}"),
            (
                "allocated bytes <= 1.1x stored",
                usage.allocated <= 1.1 * result.stored,
                f"{usage.allocated / result.stored:.2f}x",
            ),
        ]
        if reference is not None:
            for which, ours_s, theirs_s in (
                ("save", result.save_s, reference.save_s),
                ("load", result.load_s, reference.load_s),
            ):
                checks.append(
                    (
                        f"{which} within 3x of safetensors",
                        ours_s <= 3 * theirs_s,
                        f"{ours_s / theirs_s:.2f}x safetensors' time",
                    )
                )
        rows += [
            f"| {result.tool} | {label} | {'yes' if ok else 'NO'} | {value} |"
            for label, ok, value in checks
        ]
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--disk", default=str(RESULTS / "scratch"), help="directory on disk")
    parser.add_argument("--shm", default="/dev/shm", help="directory in memory (tmpfs)")
    parser.add_argument("--workloads", nargs="*", default=list(WORKLOADS))
    parser.add_argument("--tools", nargs="*", help="subset of tools (default: all installed)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="100 blobs and a tiny GPT-2")
    parser.add_argument("--docs", action="store_true", help="write the tables into docs/")
    args = parser.parse_args(argv)
    with memory_kept(not args.smoke) as memory:
        names = args.tools or list(tools())
        if args.smoke:
            args.workloads, args.repeat = list(SMOKE_WORKLOADS), 1
            names = [name for name in names if name in SMOKE_TOOLS]
        Path(args.disk).mkdir(parents=True, exist_ok=True)
        locations = {"disk": Path(args.disk), "memory": Path(args.shm)}
        cold = drop_caches()
        report = [
            f"Median of {args.repeat}; disk loads {'cold' if cold else 'warm'}; "
            f"`python -m benchmarks.blob_count{' --smoke' if args.smoke else ''}`. {memory}".rstrip()
        ]
        target_rows: list[str] = []
        for label, location in locations.items():
            for workload in args.workloads:
                results = run_workload(location, workload, names, args.repeat, not args.smoke)
                blobs = make_workload(workload)
                report += [
                    "",
                    f"**{workload} ({len(blobs)} blobs, {nbytes(blobs) / MiB:.1f} MiB), "
                    f"{label} ({location})**",
                    "",
                    table(results),
                ]
                if workload == TARGET_WORKLOAD:
                    target_rows += [
                        row.replace("| ", f"| {label} | ", 1) for row in targets(results)
                    ]
        if target_rows:
            report += [
                "",
                "| location | format | target (10,000 x 4 KiB) | met | measured |",
                "|---|---|---|---|---|",
                *target_rows,
            ]
        publish("\n".join(report), "blob_count", "blob-count", smoke=args.smoke, docs=args.docs)
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
