"""Save and restore of the standard mixed checkpoint to a local S3 server (moto), with
ckptstore and with plain s3fs, on loopback and with 20 ms of added latency.

The checkpoint: ``mixed-1g`` of :mod:`benchmarks.workload`, 8 x 96 MiB, 200 x ~1 MiB and
2000 x 1-16 KiB float32 blobs (~1 GiB).
Methods, each against a fresh moto server:

* ``ckptstore <db>``: ``CheckpointManager.save`` / ``load`` to ``s3://`` (defaults);
* ``s3fs sequential``: one ``pipe_file`` / ``cat_file`` per blob, one at a time;
* ``s3fs batched``: one ``pipe`` / ``cat`` call with every blob;
* ``server ceiling``: one large object PUT and GET with a bare HTTP client, with the
  best parallelism (:mod:`benchmarks.s3_ceiling`).

Latency: the server runs in a network namespace joined by a veth pair; ``tc netem``
delays its packets by 20 ms when the kernel has netem, else a user-space relay adds the
same round trip (20 ms per request, 20 ms per new connection). Needs root and iproute2.
Peak memory is the benchmark process's resident size above what it held before the
operation (the checkpoint itself), sampled every 5 ms.

Example::

    python -m benchmarks.object_store            # full run: benchmarks/results/object_store.md
    python -m benchmarks.object_store --smoke    # tiny data, under ~30 s (CI): *_smoke.md
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import os
import platform
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.network import LatencyRelay, NetworkNamespace
from benchmarks.report import BENCHMARKS_PAGE, update_docs_section
from benchmarks.s3_ceiling import FAKE_AUTH, measure_ceiling
from benchmarks.system import memory_kept
from benchmarks.workload import make_workload
from ckptstore import CheckpointManager, LocalSession, Node
from ckptstore.plugin import get_registry
from ckptstore.testing import MotoServer

DEFAULT_FORMAT = "zarr"  # ckptstore's default format
GiB = float(1 << 30)
MiB = 1 << 20
KEY, SECRET = "bench", "bench-secret"
RESULTS = Path(__file__).resolve().parent / "results" / "object_store.md"
SMOKE_RESULTS = RESULTS.with_name("object_store_smoke.md")


# -- the checkpoint ---------------------------------------------------------------------


def standard_checkpoint(smoke: bool, scale: float = 1.0) -> dict[str, np.ndarray[Any, Any]]:
    """The ``mixed-1g`` workload (8 x 96 MiB, 200 x ~1 MiB, 2000 x 1-16 KiB float32);
    ``scale`` keeps that fraction of each group; smoke: 2 x 1 MiB, 5 x 64 KiB, 20 small
    (the first blobs of ``tiny``)."""
    blobs = make_workload("tiny" if smoke else "mixed-1g")
    groups: dict[str, list[str]] = {}
    for name in blobs:
        groups.setdefault(name.split(".")[0], []).append(name)
    keep: list[str] = []
    for group, names in groups.items():
        count = {"layers": 2, "mid": 5, "small": 20}[group] if smoke else round(len(names) * scale)
        keep.extend(names[: max(1, count)])
    return {name: blobs[name] for name in keep}


# -- measuring ---------------------------------------------------------------------------


@dataclass
class Measurement:
    seconds: float
    peak_extra: int


_PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_bytes() -> int:
    """This process's resident memory now (Linux)."""
    with open("/proc/self/statm", "rb") as statm:
        return int(statm.read().split()[1]) * _PAGE


@contextlib.contextmanager
def measured() -> Iterator[Callable[[], Measurement]]:
    """Time the block and sample this process's RSS above its level at the start."""
    baseline = resident_bytes()
    peak = [baseline]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.005):
            peak[0] = max(peak[0], resident_bytes())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.perf_counter()
    result: list[Measurement] = []
    try:
        yield lambda: result[0]
    finally:
        elapsed = time.perf_counter() - started
        stop.set()
        sampler.join()
        peak[0] = max(peak[0], resident_bytes())
        result.append(Measurement(elapsed, peak[0] - baseline))


@dataclass
class Row:
    scenario: str
    method: str
    nbytes: int
    save: Measurement
    load: Measurement
    budget: int | None = None
    notes: list[str] = field(default_factory=list)

    def rate(self, which: str) -> float:
        seconds = (self.save if which == "save" else self.load).seconds
        return self.nbytes / GiB / seconds if seconds else 0.0


# -- methods -----------------------------------------------------------------------------


def run_ckptstore(
    endpoint: str, blobs: dict[str, np.ndarray[Any, Any]], db_type: str
) -> tuple[Measurement, Measurement, int]:
    options = {"endpoint_url": endpoint, "key": KEY, "secret": SECRET, "region": "us-east-1"}
    session = LocalSession()
    session.workspace("trainer_0").update(blobs)
    manager = CheckpointManager("s3://bench/run", "trainer_0", db_type, storage_options=options)
    with Node("trainer_0"):
        session.run(manager.init(["trainer_0"]))
    with measured() as save:
        session.run(manager.save(1))
    restored = LocalSession()
    with Node("trainer_0"):
        restored.run(manager.init(["trainer_0"], retrieve_from_epoch=1))
    with measured() as load:
        restored.run(manager.load(1))
    check(blobs, restored.workspace("trainer_0"))
    settings = manager.location.io_settings
    storage: Any = manager.location.storage
    budget = max(settings.memory_budget, storage.options.buffer_bytes)
    return save(), load(), budget


def s3fs_filesystem(endpoint: str) -> Any:
    import s3fs

    return s3fs.S3FileSystem(
        endpoint_url=endpoint,
        key=KEY,
        secret=SECRET,
        client_kwargs={"region_name": "us-east-1"},
        skip_instance_cache=True,
    )


def run_s3fs_sequential(
    endpoint: str, blobs: dict[str, np.ndarray[Any, Any]]
) -> tuple[Measurement, Measurement]:
    fs = s3fs_filesystem(endpoint)
    with measured() as save:
        for name, array in blobs.items():
            fs.pipe_file(f"bench/seq/{name}", array.tobytes())
    restored: dict[str, np.ndarray[Any, Any]] = {}
    with measured() as load:
        for name, array in blobs.items():
            restored[name] = np.frombuffer(fs.cat_file(f"bench/seq/{name}"), array.dtype)
    check(blobs, restored)
    return save(), load()


def run_s3fs_batched(
    endpoint: str, blobs: dict[str, np.ndarray[Any, Any]]
) -> tuple[Measurement, Measurement]:
    fs = s3fs_filesystem(endpoint)
    with measured() as save:
        fs.pipe({f"bench/batch/{name}": array.tobytes() for name, array in blobs.items()})
    with measured() as load:
        found = fs.cat([f"bench/batch/{name}" for name in blobs])
        restored = {
            name: np.frombuffer(found[f"bench/batch/{name}"], array.dtype)
            for name, array in blobs.items()
        }
    check(blobs, restored)
    return save(), load()


def check(expected: dict[str, np.ndarray[Any, Any]], found: Any) -> None:
    for name, array in expected.items():
        if not np.array_equal(np.asarray(found[name]).reshape(-1), array.reshape(-1)):
            raise RuntimeError(f"blob {name!r} did not come back intact")


# -- scenarios ---------------------------------------------------------------------------


IN_MEMORY = {"MOTO_S3_DEFAULT_KEY_BUFFER_SIZE": str(1 << 40)}
"""moto's environment to keep every object in memory: by default it writes each object
over 5 MiB to a temporary file, on the disk the benchmark's local saves use."""


def moto_storage(in_memory: bool) -> str:
    """Where moto keeps its objects, as the benchmarks' tables say it."""
    return "objects in memory" if in_memory else "objects in temporary files on this disk"


@contextlib.contextmanager
def loopback_server(niceness: int = 0, *, in_memory: bool = False) -> Iterator[str]:
    with MotoServer(command_prefix=_nice(niceness), env=IN_MEMORY if in_memory else None) as server:
        server.create_bucket("bench")
        yield server.endpoint_url


@contextlib.contextmanager
def delayed_server(
    network: NetworkNamespace,
    delay_ms: float,
    port: int,
    niceness: int = 0,
    *,
    in_memory: bool = False,
) -> Iterator[str]:
    """moto in ``network`` (and the latency relay, without netem), both at ``niceness``;
    ``in_memory``: moto writes no object to disk (:data:`IN_MEMORY`)."""
    server = MotoServer(
        host=network.inner_address,
        port=port,
        command_prefix=[*network.exec_prefix, *_nice(niceness)],
        env=IN_MEMORY if in_memory else None,
    )
    with server:
        server.create_bucket("bench")
        if network.netem:
            yield server.endpoint_url
        else:
            relay = LatencyRelay(network.inner_address, port, delay_ms=delay_ms)
            relay.command_prefix = _nice(niceness)
            with relay:
                yield relay.endpoint_url


def _nice(niceness: int) -> list[str]:
    """The prefix that runs a command at ``niceness`` (none for 0)."""
    return ["nice", "-n", str(niceness)] if niceness else []


def round_trip_ms(endpoint: str) -> float:
    parsed = urllib.parse.urlsplit(endpoint)
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        connection = http.client.HTTPConnection(
            parsed.hostname or "127.0.0.1", parsed.port, timeout=30
        )
        connection.request("HEAD", "/bench", headers=FAKE_AUTH)
        connection.getresponse().read()
        connection.close()
        best = min(best, time.perf_counter() - started)
    return best * 1000


def run_scenario(
    name: str,
    server: Callable[[], contextlib.AbstractContextManager[str]],
    blobs: dict[str, np.ndarray[Any, Any]],
    db_types: list[str],
    methods: set[str],
) -> tuple[list[Row], float]:
    nbytes = sum(array.nbytes for array in blobs.values())
    rows: list[Row] = []
    rtt = 0.0
    for db_type in db_types:
        with server() as endpoint:
            rtt = round_trip_ms(endpoint)
            save, load, budget = run_ckptstore(endpoint, blobs, db_type)
            rows.append(Row(name, f"ckptstore {db_type}", nbytes, save, load, budget))
            report_progress(rows[-1])
    if "batched" in methods:
        with server() as endpoint:
            rows.append(
                Row(name, "s3fs batched pipe/cat", nbytes, *run_s3fs_batched(endpoint, blobs))
            )
            report_progress(rows[-1])
    if "sequential" in methods:
        with server() as endpoint:
            rows.append(
                Row(
                    name, "s3fs sequential puts/gets", nbytes, *run_s3fs_sequential(endpoint, blobs)
                )
            )
            report_progress(rows[-1])
    if "ceiling" in methods:
        size = min(nbytes, 1 << 30)
        with server() as endpoint:
            ceiling = measure_ceiling(endpoint, "bench", size)
            method = f"moto ceiling: {ceiling.put_method} / {ceiling.get_method} (bare HTTP)"
            save, load = Measurement(ceiling.put_seconds, 0), Measurement(ceiling.get_seconds, 0)
            rows.append(Row(name, method, size, save, load))
            report_progress(rows[-1])
    return rows, rtt


def report_progress(row: Row) -> None:
    print(
        f"  {row.scenario:>10} | {row.method:<38} save {row.rate('save'):6.3f} GiB/s "
        f"({row.save.seconds:7.2f} s)  load {row.rate('load'):6.3f} GiB/s "
        f"({row.load.seconds:7.2f} s)",
        flush=True,
    )


# -- report ------------------------------------------------------------------------------


def _ratio(row: Row, other: Row | None, which: str) -> str:
    """How many times faster ``row`` is than ``other`` (blank for itself or nothing)."""
    if other is None or other is row or not other.rate(which):
        return ""
    return f"{row.rate(which) / other.rate(which):.2f}x"


def table(rows: list[Row], rtts: dict[str, float]) -> str:
    lines = [
        "| scenario | method | save GiB/s | load GiB/s | save vs sequential | save vs batched "
        "| load vs sequential | load vs batched | vs ceiling (save / load) "
        "| peak extra memory save / load (budget) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for scenario in dict.fromkeys(row.scenario for row in rows):
        group = [row for row in rows if row.scenario == scenario]
        find = {
            row.method.split()[1] if row.method.startswith("s3fs") else row.method: row
            for row in group
        }
        sequential, batched = find.get("sequential"), find.get("batched")
        ceiling = next((row for row in group if row.method.startswith("moto")), None)
        for row in group:
            ratio = partial(_ratio, row)

            memory = f"{row.save.peak_extra / MiB:.0f} / {row.load.peak_extra / MiB:.0f} MiB"
            if row.budget is not None:
                memory += f" ({row.budget / MiB:.0f} MiB)"
            versus_ceiling = (
                f"{ratio(ceiling, 'save')} / {ratio(ceiling, 'load')}"
                if ceiling is not None and ceiling is not row
                else ""
            )
            label = f"{scenario} ({rtts.get(scenario, 0):.0f} ms/request)"
            lines.append(
                f"| {label} | {row.method} | {row.rate('save'):.3f} | {row.rate('load'):.3f} "
                f"| {ratio(sequential, 'save')} | {ratio(batched, 'save')} "
                f"| {ratio(sequential, 'load')} | {ratio(batched, 'load')} "
                f"| {versus_ceiling} | {memory} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny data, under ~30 s")
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the blobs")
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--no-latency", action="store_true", help="loopback only")
    parser.add_argument(
        "--db-types",
        default="",
        help="comma-separated DB types (default: the default one, zarr; npz loads are "
        "ranged GETs into one archive, which moto answers by copying the whole object "
        "each time: run it with --scale)",
    )
    parser.add_argument(
        "--methods",
        default="sequential,batched,ceiling",
        help="baselines to run: sequential, batched, ceiling",
    )
    parser.add_argument(
        "--output", type=Path, default=None, help=f"default: {RESULTS} ({SMOKE_RESULTS.name})"
    )
    parser.add_argument("--docs", action="store_true", help="also update docs/benchmarks-tables.md")
    args = parser.parse_args(argv)
    output: Path = args.output or (SMOKE_RESULTS if args.smoke else RESULTS)

    db_types = [name for name in args.db_types.split(",") if name] or [DEFAULT_FORMAT]
    unknown = set(db_types) - set(get_registry().db_types)
    if unknown:
        parser.error(f"unknown DB types {sorted(unknown)}")
    methods = {name.strip() for name in args.methods.split(",") if name.strip()}
    blobs = standard_checkpoint(args.smoke, args.scale)
    nbytes = sum(array.nbytes for array in blobs.values())
    print(
        f"checkpoint: {len(blobs)} float32 blobs, {nbytes / GiB:.3f} GiB; DB types {db_types}",
        flush=True,
    )
    rows, rtts = [], {}
    with memory_kept(not args.smoke) as memory_note:
        scenario_rows, rtts["loopback"] = run_scenario(
            "loopback", loopback_server, blobs, db_types, methods
        )
        rows.extend(scenario_rows)
        latency_note = ""
        if not args.no_latency:
            label = f"+{args.latency_ms:g} ms"
            with NetworkNamespace("ckptbench", delay_ms=args.latency_ms) as network:
                latency_note = (
                    "tc netem on the namespace's veth"
                    if network.netem
                    else "a user-space relay (this kernel has no sch_netem for tc netem)"
                )
                print(f"latency: {latency_note}", flush=True)
                port = 9100 + os.getpid() % 500
                scenario_rows, rtts[label] = run_scenario(
                    label,
                    lambda: delayed_server(network, args.latency_ms, port),
                    blobs,
                    db_types,
                    methods,
                )
                rows.extend(scenario_rows)
    command = " ".join(["python -m benchmarks.object_store", *(argv or sys.argv[1:])])
    text = "\n".join(
        [
            f"# Object-store benchmark{' (smoke)' if args.smoke else ''}",
            "",
            f"Command: `{command}`. Machine: {os.cpu_count()} cores, "
            f"{os.sysconf('SC_PHYS_PAGES') * _PAGE / GiB:.0f} GiB, Python "
            f"{platform.python_version()}, {platform.system()} {platform.release()}.",
            f"Checkpoint: {len(blobs)} float32 blobs, {nbytes / GiB:.3f} GiB. Server: moto "
            "in a subprocess, a fresh one per method. Latency: "
            + (latency_note or "none")
            + f". ms/request: the best time of a HEAD on a new connection. {memory_note}".rstrip(),
            "",
            table(rows, rtts),
            "",
        ]
    )
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text)
    if args.docs:
        update_docs_section(BENCHMARKS_PAGE, "object-store", text.split("\n", 2)[2].strip())
    print()
    print(text)
    print(f"written to {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
