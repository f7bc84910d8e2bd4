"""Run one save or load in a fresh process and report its time and memory.

    python -m benchmarks.measure TOOL OP WORKLOAD DIR

prints one JSON line: ``seconds``, ``cpu_seconds`` (user and system time of every
thread of the process during the operation, ``getrusage``), ``peak_above_state`` (the
most resident memory above what the process held just before the operation; the peak
counter is reset through ``/proc/self/clear_refs``), ``bytes_read`` (``rchar`` of
``/proc/self/io``).
OP is ``save``, ``load``, ``partial`` (load one ~1 MiB blob, ckptstore tools only) or
``bare-read`` (:mod:`benchmarks.bare_read`; TOOL is one of its two names, WORKLOAD is
not used; prints ``seconds``, ``cpu_seconds`` and ``bytes``).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.bare_read import CHECKED, read_bare
from benchmarks.peers import tools
from benchmarks.system import peak_resident, reset_peak_resident, resident
from benchmarks.workload import make_workload

PARTIAL_BLOB = "mid.0.weight"


def _rchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    return 0


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def prepare(tool: str) -> None:
    """Import what the tool needs before the clock starts (imports are not I/O)."""
    import ckptstore

    ckptstore.plugin.get_registry()
    if "torch" in tool:
        import torch.distributed.checkpoint  # noqa: F401
    if tool == "zarr-python":  # not for "ckptstore zarr": ckptstore never imports it
        import zarr  # noqa: F401
    if "safetensors" in tool:
        import safetensors.numpy  # noqa: F401
    if "tensorstore" in tool:
        import tensorstore  # noqa: F401


def run(tool: str, op: str, workload: str, directory: Path) -> dict[str, Any]:
    if op == "bare-read":  # no ckptstore code: the floor of a checked load
        return dict(read_bare(directory, checksum=tool == CHECKED))
    save, load = tools()[tool]
    blobs = make_workload(workload)
    prepare(tool)
    before = resident()
    reset_peak_resident()
    read_before = _rchar()
    cpu_before = _cpu_seconds()
    started = time.perf_counter()
    if op == "save":
        save(blobs, directory)
    elif op == "load":
        state = load(blobs, directory)
        assert len(state) == len(blobs)
    elif op == "partial":
        from benchmarks.peers import ckptstore_partial_load

        db_type = tool.split()[1]
        assert ckptstore_partial_load(db_type, PARTIAL_BLOB, directory).shape == (
            blobs[PARTIAL_BLOB].shape
        )
    seconds = time.perf_counter() - started
    return {
        "seconds": seconds,
        "cpu_seconds": _cpu_seconds() - cpu_before,
        "peak_above_state": max(0, peak_resident() - before),
        "bytes_read": _rchar() - read_before,
    }


def measure(
    tool: str, op: str, workload: str, directory: Path, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run :func:`run` in a fresh interpreter (clean memory accounting); ``env`` adds
    environment variables (``CKPTSTORE_IO_*`` tune ckptstore's engine)."""
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.measure", tool, op, workload, str(directory)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, **(env or {})},
    )
    if result.returncode != 0:
        raise RuntimeError(f"{tool} {op} failed:\n{result.stderr}")
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


Operation = Callable[[str, str, str, Path], dict[str, Any]]
"""``operation(tool, op, workload, directory)``: one save, load, partial load or bare
read and what it measured (:func:`run`'s result)."""


def operation_for(fresh: bool) -> Operation:
    """:func:`measure` (each operation in a fresh process) or, unless ``fresh``,
    :func:`run` in this one (smoke runs: starting a process that loads every plugin
    costs more than the operation)."""
    return measure if fresh else run


if __name__ == "__main__":
    tool_name, operation, workload_name, target = sys.argv[1:5]
    print(json.dumps(run(tool_name, operation, workload_name, Path(target))))
