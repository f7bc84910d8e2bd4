"""The job whose save is crashed, and what must hold in every crash state.

The job: two nodes, each holding the "1 GiB mix" scaled down (:class:`Shape`): large
blobs written from their own memory and ``O_DIRECT``, shared among several archives per
node (the archive size lowered so a few MiB make several), and many small blobs. Every
epoch adds one to every blob, so epoch ``e``'s state is known exactly. Epoch 1 is
committed before the recording; the recorded run resumes from it and saves epoch 2.

In every crash state (:func:`check_state`), before anything else touches it,
``ckptstore verify`` judges epochs 1 and 2; then a rerun of the job (``JobRunner`` with
the same epoch limit, its default lease) resumes. It must:

* resume from epoch 2 or 1, never start over (epoch 1 is committed before the crash);
* end with exactly epoch 2's state (a restore of epoch 2 loaded it exactly, or a resume
  from epoch 1 loaded that exactly and trained one epoch), epoch 2 committed;
* resume from epoch 2 exactly when ``verify`` passed epoch 2; ``verify`` passes epoch 1.
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ckptstore.checkpoint._multinode import MultiNodeCheckpointManager
from ckptstore.checkpoint._runner import JobRunner
from ckptstore.cli._main import main as cli_main
from ckptstore.execution._job import Job, epoch_limiter
from ckptstore.execution._node import Node
from ckptstore.execution._session import LocalSession
from ckptstore.execution._task import Task
from ckptstore.execution._workspace import Workspace
from ckptstore.io import IOSettings, _write_plan
from ckptstore.object_store import ObjectStorePath

MiB = 1 << 20
NODES = ("trainer_0", "trainer_1")
DTYPES = (np.float32, np.int64, np.uint8, np.float64, np.int16)


@dataclass(frozen=True)
class Shape:
    """Per node: ``large`` blob sizes in bytes (each ``O_DIRECT`` once over 1 MiB,
    cut into pieces of ``chunk_bytes``), ``small`` blobs of 8 bytes to 4 KiB, and the
    archive size that spreads the large ones over several archives."""

    name: str
    large: tuple[int, ...]
    small: int
    archive_bytes: int
    chunk_bytes: int = MiB

    def io(self) -> IOSettings:
        return IOSettings(chunk_bytes=self.chunk_bytes)


SMALL = Shape("small", large=(2 * MiB + 12288, MiB + 4096), small=24, archive_bytes=MiB)
MIX = Shape(
    "mix",
    large=(6 * MiB + 8192, 3 * MiB, 2 * MiB + 4096, MiB + 20480),
    small=400,
    archive_bytes=2 * MiB,
)
SHAPES = {shape.name: shape for shape in (SMALL, MIX)}


def initial_blobs(shape: Shape, node: str) -> dict[str, np.ndarray]:
    """The node's blobs at epoch 0 (seeded by the node's name): new arrays."""
    return {name: array.copy() for name, array in _initial(shape, node).items()}


@functools.cache
def _initial(shape: Shape, node: str) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(sum(node.encode()))
    blobs: dict[str, np.ndarray] = {}
    for index, nbytes in enumerate(shape.large):
        if nbytes % 4:
            blobs[f"{node}/large_{index}"] = rng.integers(0, 256, nbytes, dtype=np.uint8)
        else:
            blobs[f"{node}/large_{index}"] = rng.standard_normal(nbytes // 4, np.float32)
    for index in range(shape.small):
        dtype = np.dtype(DTYPES[index % len(DTYPES)])
        count = int(rng.integers(1, 4096 // dtype.itemsize + 1))
        values = rng.integers(-100, 100, count).astype(dtype)
        blobs[f"{node}/small_{index}"] = values
    return blobs


def _bump(array: np.ndarray) -> None:
    if array.dtype.kind == "f":
        np.add(array, 1, out=array)
    else:
        np.add(array, 1, out=array, casting="unsafe")


def expected(shape: Shape, node: str, epoch: int) -> dict[str, np.ndarray]:
    """The node's blobs after ``epoch`` epochs."""
    blobs = initial_blobs(shape, node)
    for array in blobs.values():
        for _ in range(epoch):
            _bump(array)
    return blobs


def _init(ws: Workspace, *, shape: Shape, node: str) -> None:
    ws.update(initial_blobs(shape, node))


def _train(ws: Workspace, *, shape: Shape, node: str) -> None:
    for name in _initial(shape, node):
        _bump(ws[name])


def build_job(shape: Shape, epochs: int) -> Job:
    """The two-node job that runs ``epochs`` epochs."""
    with Job() as job:
        for node in NODES:
            with Node(node):
                with job.init_group:
                    Task(functools.partial(_init, shape=shape, node=node), name=f"{node}/init")
                Task(functools.partial(_train, shape=shape, node=node), name=f"{node}/train")
        epoch_limiter(job, epochs)
    return job


@contextlib.contextmanager
def archive_bytes(size: int) -> Iterator[None]:
    """Lower the packed formats' archive size so a few MiB make several archives (on
    local disk and object stores alike)."""
    saved = _write_plan.ARCHIVE_BYTES, ObjectStorePath.archive_bytes
    _write_plan.ARCHIVE_BYTES = ObjectStorePath.archive_bytes = size
    try:
        yield
    finally:
        _write_plan.ARCHIVE_BYTES, ObjectStorePath.archive_bytes = saved


def run_job(
    url: str,
    db_type: str,
    shape: Shape,
    epochs: int,
    storage_options: dict[str, Any] | None = None,
) -> tuple[JobRunner, LocalSession]:
    """Run (or rerun: resume) the job to ``epochs`` on ``url`` (on S3, archives of
    1 MiB and more go up in multipart uploads)."""
    if url.startswith("s3://"):
        storage_options = {"multipart_threshold": MiB, **(storage_options or {})}
    manager = MultiNodeCheckpointManager(
        url, db_type, metadata_handler="json", io=shape.io(), storage_options=storage_options
    )
    runner = JobRunner(build_job(shape, epochs), manager)
    session = LocalSession()
    with archive_bytes(shape.archive_bytes):
        runner.train(session)
    return runner, session


def verify_exit(url: str, epoch: int, options: list[str]) -> tuple[int, str]:
    """``ckptstore verify URL --epoch N``: its exit code and what it printed."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli_main(["verify", url, "--epoch", str(epoch), *options])
    return code, out.getvalue() + err.getvalue()


@dataclass
class Outcome:
    """What a crash state led to."""

    verify: dict[int, int]
    resumed_from: int | None
    problems: list[str]


def check_state(
    url: str,
    db_type: str,
    shape: Shape,
    *,
    completed: bool,
    verify_options: list[str] | None = None,
    storage_options: dict[str, Any] | None = None,
) -> Outcome:
    """Judge one crash state at ``url`` (module docstring); ``completed``: the save had
    returned before the crash (epoch 2 was committed)."""
    options = verify_options or []
    codes: dict[int, int] = {}
    texts: dict[int, str] = {}
    for epoch in (1, 2):
        codes[epoch], texts[epoch] = verify_exit(url, epoch, options)
    problems: list[str] = []
    if codes[1] != 0:
        problems.append(f"verify of the committed epoch 1 exits {codes[1]}: {texts[1][-400:]}")
    if codes[2] not in (0, 3, 4):
        problems.append(f"verify of epoch 2 exits {codes[2]}: {texts[2][-400:]}")
    if completed and codes[2] != 0:
        problems.append(f"epoch 2 was committed before the crash, verify exits {codes[2]}")
    logging.disable(logging.WARNING)
    try:
        runner, session = run_job(url, db_type, shape, 2, storage_options)
    except Exception as error:  # the state's verdict: reported, not raised
        problems.append(f"the rerun failed: {type(error).__name__}: {error}")
        return Outcome(codes, None, problems)
    finally:
        logging.disable(logging.NOTSET)
    resumed = runner.resumed_from_epoch
    if resumed not in (1, 2):
        problems.append(f"the rerun resumed from {resumed}, not from epoch 1 or 2")
    if completed and resumed != 2:
        problems.append(f"epoch 2 was committed before the crash, the rerun resumed from {resumed}")
    if (codes[2] == 0) != (resumed == 2):
        problems.append(f"verify of epoch 2 exits {codes[2]} but the rerun resumed from {resumed}")
    for node in NODES:
        workspace = session.workspace(node)
        for name, array in expected(shape, node, 2).items():
            got = workspace[name]
            if (got.dtype, got.shape, got.tobytes()) != (array.dtype, array.shape, array.tobytes()):
                problems.append(f"{name} differs from epoch 2's state after the rerun")
                break
    return Outcome(codes, resumed, problems)


def environment_for_child() -> dict[str, str]:
    """The environment a recording child runs in (this process's ``sys.path`` first)."""
    import sys

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env
