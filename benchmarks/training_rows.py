"""The training loops compared by :mod:`benchmarks.training_loop`, one per way of
checkpointing. Each runs ``epochs`` epochs of the same fixed compute on the same state
and saves after the initial state and after every epoch, as ``JobRunner`` does.

    python -m benchmarks.training_rows ROW MIB EPOCHS ITERATIONS DIRECTORY
    python -m benchmarks.training_rows probe MIB

runs one loop (or times the compute, for the calibration) in this process and prints
one JSON line (``blocked``: seconds the loop
waited at each save; ``total``: the whole loop, including the wait for the last save;
``compute``: each epoch's compute, which a background save may slow down by taking
CPU; ``peak_above_state``: the most resident memory above the state).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.system import peak_resident, reset_peak_resident, resident

MiB = 1 << 20
NODE = "trainer_0"
KERNEL = 256  # the compute kernel: a KERNEL x KERNEL float32 matmul

State = dict[str, np.ndarray]
Timings = tuple[list[float], float, list[float]]
"""Seconds blocked at each save, the whole loop, and each epoch's compute."""


def make_state(mib: int) -> State:
    """``mib`` MiB of float32 blobs of at most 16 MiB each, plus a step counter."""
    blob = min(16 * MiB, mib * MiB // 4)
    rng = np.random.default_rng(13)
    state = {
        f"layer.{i}.weight": rng.random(blob // 4, dtype=np.float32)
        for i in range(mib * MiB // blob)
    }
    state["step"] = np.zeros(1, dtype=np.int64)
    return state


COMPUTE_THREADS = "CKPTSTORE_BENCH_COMPUTE_THREADS"
"""Environment variable: BLAS threads the compute may use (unset: the BLAS default,
every core)."""


@contextlib.contextmanager
def compute_threads() -> Iterator[None]:
    """Limit BLAS to ``$CKPTSTORE_BENCH_COMPUTE_THREADS`` threads while inside (a training
    step that leaves host cores free, as an accelerator's does)."""
    threads = os.environ.get(COMPUTE_THREADS)
    if not threads:
        yield
        return
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=int(threads), user_api="blas"):
        yield


def compute(state: State, iterations: int) -> None:
    """One epoch: ``iterations`` matmuls, then an in-place update of every blob (as an
    optimizer step rewrites the parameters)."""
    a = np.full((KERNEL, KERNEL), 0.5, dtype=np.float32)
    for _ in range(iterations):
        a = np.tanh(a @ a)
    for name, array in state.items():
        if name != "step":
            np.multiply(array, np.float32(0.999), out=array)
    state["step"] += 1


def async_supported() -> bool:
    """Whether this ckptstore's ``JobRunner`` takes ``async_save``."""
    from ckptstore import JobRunner

    return "async_save" in inspect.signature(JobRunner).parameters


# -- loops driven by JobRunner -------------------------------------------------------------


def jobrunner_loop(
    state: State,
    epochs: int,
    iterations: int,
    directory: Path | None,
    async_save: bool,
    background_nice: int | None = None,
) -> Timings:
    """``JobRunner(...).train`` with a train task of fixed compute; a save's blocked time
    is the gap between one compute task's end and the next one's start.
    ``background_nice`` overrides the async writer's priority (None: the default)."""
    from ckptstore import CheckpointManager, Job, JobRunner, LocalSession, Node, Task, epoch_limiter

    marks: list[float] = []

    def init(ws: Any) -> None:
        ws.update(state)
        marks.append(time.perf_counter())

    def train(ws: Any) -> None:
        marks.append(time.perf_counter())
        compute(state, iterations)
        marks.append(time.perf_counter())

    with Job() as job, Node(NODE):
        with job.init_group:
            Task(init, name="init")
        Task(train, name="train")
        epoch_limiter(job, epochs)
    manager = None if directory is None else CheckpointManager(str(directory), NODE, "zarr")
    options: dict[str, Any] = {"async_save": True} if async_save else {}
    if background_nice is not None:
        options["background_nice"] = background_nice
    started = time.perf_counter()
    JobRunner(job, manager, **options).train(LocalSession())
    total = time.perf_counter() - started
    gaps = [marks[i + 1] - marks[i] for i in range(0, len(marks) - 1, 2)]
    computes = [marks[i + 1] - marks[i] for i in range(1, len(marks) - 1, 2)]
    return gaps, total, computes


# -- loops written by hand (the same shape) ---------------------------------------------------


def manual_loop(
    state: State,
    epochs: int,
    iterations: int,
    save: Callable[[int], None],
    finish: Callable[[], None],
) -> Timings:
    blocked = []
    computes = []
    started = time.perf_counter()
    for epoch in range(epochs + 1):
        if epoch:
            before = time.perf_counter()
            compute(state, iterations)
            computes.append(time.perf_counter() - before)
        before = time.perf_counter()
        save(epoch)
        blocked.append(time.perf_counter() - before)
    finish()
    return blocked[:-1], time.perf_counter() - started, computes


def copyto_loop(state: State, epochs: int, iterations: int) -> Timings:
    """The floor of any snapshot: ``np.copyto`` of the state into preallocated buffers."""
    buffers = {name: np.ones_like(array) for name, array in state.items()}

    def save(epoch: int) -> None:
        for name, array in state.items():
            np.copyto(buffers[name], array)

    return manual_loop(state, epochs, iterations, save, lambda: None)


def _single_process_group() -> None:
    """A gloo process group of one on 127.0.0.1 (for a torch that wants one)."""
    import socket

    import torch.distributed as dist

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)


def dcp_async_loop(state: State, epochs: int, iterations: int, directory: Path) -> Timings:
    """``torch.distributed.checkpoint.async_save`` every epoch; a save first waits for
    the previous one (one in flight, as torch's documentation advises). Single process:
    no process group unless this torch refuses to save without one."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    tensors = {name: torch.from_numpy(array) for name, array in state.items()}
    pending: list[Any] = []

    def wait() -> None:
        while pending:
            pending.pop().result()

    def save(epoch: int) -> None:
        wait()
        path = str(directory / f"epoch-{epoch}")
        writer = dcp.FileSystemWriter(path, sync_files=True)  # type: ignore[attr-defined]
        try:
            future = dcp.async_save(tensors, storage_writer=writer)  # type: ignore[attr-defined]
        except (RuntimeError, ValueError):
            if dist.is_initialized():
                raise
            _single_process_group()
            future = dcp.async_save(tensors, storage_writer=writer)  # type: ignore[attr-defined]
        pending.append(future)

    try:
        return manual_loop(state, epochs, iterations, save, wait)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


ROWS = {
    "no checkpoint": "none",
    "np.copyto into preallocated buffers": "copyto",
    "ckptstore sync save (JobRunner)": "sync",
    "ckptstore async save (JobRunner(async_save=True))": "async",
    "ckptstore async save, writer 10 nice levels down (background_nice=10)": "async-nice10",
    "torch.distributed.checkpoint async_save": "dcp-async",
}


def prepare(row: str) -> None:
    """Import what the loop needs and warm up the compute kernel before anything is
    measured (code and thread pools are not checkpoint memory or time)."""
    import ckptstore

    ckptstore.plugin.get_registry()
    compute({"w": np.zeros(16, dtype=np.float32), "step": np.zeros(1, dtype=np.int64)}, 2)
    if row == "dcp-async":
        import torch.distributed.checkpoint  # noqa: F401


def run_row(row: str, mib: int, epochs: int, iterations: int, directory: Path) -> dict[str, Any]:
    """One loop; ``row`` is a value of :data:`ROWS`."""
    with compute_threads():
        return _run_row(row, mib, epochs, iterations, directory)


def _run_row(row: str, mib: int, epochs: int, iterations: int, directory: Path) -> dict[str, Any]:
    prepare(row)
    state = make_state(mib)
    reset_peak_resident()
    before = resident()
    if row == "none":
        blocked, total, computes = jobrunner_loop(state, epochs, iterations, None, False)
    elif row == "sync":
        blocked, total, computes = jobrunner_loop(state, epochs, iterations, directory, False)
    elif row == "async":
        blocked, total, computes = jobrunner_loop(state, epochs, iterations, directory, True)
    elif row == "async-nice10":
        blocked, total, computes = jobrunner_loop(state, epochs, iterations, directory, True, 10)
    elif row == "copyto":
        blocked, total, computes = copyto_loop(state, epochs, iterations)
    elif row == "dcp-async":
        blocked, total, computes = dcp_async_loop(state, epochs, iterations, directory)
    else:
        raise ValueError(f"unknown row {row!r}")
    peak = max(0, peak_resident() - before)
    return {"blocked": blocked, "total": total, "compute": computes, "peak_above_state": peak}


PROBE_S = 0.5
"""Each compute probe runs at least this long (a few matmuls time the BLAS warm-up)."""


def probe_compute(mib: int) -> dict[str, float]:
    """Seconds of the update and of one matmul (median of 3 probes of >= ``PROBE_S``
    each) on a fresh state of ``mib`` MiB, in the conditions of a loop's process."""
    with compute_threads():
        prepare("none")
        state = make_state(mib)
        started = time.perf_counter()
        compute(state, 0)
        update_s = time.perf_counter() - started
        probe, per_iteration = 16, []
        while len(per_iteration) < 3:
            started = time.perf_counter()
            compute(state, probe)
            elapsed = time.perf_counter() - started - update_s
            if elapsed < PROBE_S:
                probe *= 2
                continue
            per_iteration.append(max(1e-9, elapsed / probe))
    return {"update_s": update_s, "per_iteration": sorted(per_iteration)[1]}


if __name__ == "__main__":
    if sys.argv[1] == "probe":
        print(json.dumps(probe_compute(int(sys.argv[2]))))
    else:
        name, size, count, work, target = sys.argv[1:6]
        print(json.dumps(run_row(name, int(size), int(count), int(work), Path(target))))
