"""A one-node job whose every epoch's bytes are known, and checks made through the
public protocol only (commit records, manifests, blobs), never through file names:
shared by the real-disk fault tests and the stateful property test."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ckptstore import Job, Node, Task, Workspace, epoch_limiter
from ckptstore.io._engine import ParallelIO
from ckptstore.io._settings import IOSettings
from ckptstore.plugin._registry import get_registry
from ckptstore.protocol import committed_epochs, newest_complete, open_node, read_blobs

NODE = "trainer_0"
BLOB_BYTES = 48_000  # random bytes: no format compresses them


def weights(step: int, salt: int = 0) -> np.ndarray:
    """The blob a job holds after training step ``step`` (``salt``: which writer)."""
    return np.random.default_rng([step, salt]).integers(0, 256, BLOB_BYTES, dtype=np.uint8)


def build_job(
    epochs: int, salt: int = 0, node: str = NODE, before_train: Callable[[], None] | None = None
) -> Job:
    """``node`` keeps a step counter and :func:`weights` of that step; runs ``epochs``;
    ``before_train`` runs at the start of every training epoch."""

    def init(ws: Workspace) -> None:
        ws.update(step=np.array(0, dtype=np.int64), w=weights(0, salt))

    def train(ws: Workspace) -> None:
        if before_train is not None:
            before_train()
        step = int(ws["step"]) + 1
        ws.update(step=np.array(step, dtype=np.int64), w=weights(step, salt))

    with Job() as job, Node(node):
        with job.init_group:
            Task(init, name="init")
        Task(train, name="train")
        epoch_limiter(job, epochs)
    return job


def committed(url: str) -> list[int]:
    """The epochs with a commit record under ``url``."""
    return committed_epochs(get_registry().open_path(url))


def resume_epoch(url: str, node: str = NODE) -> int | None:
    """The epoch a resume of ``node`` picks (newest committed and intact by its record)."""
    return newest_complete(get_registry().open_path(url), [node])


def load_epoch(url: str, epoch: int, db_type: str, node: str = NODE) -> dict[str, np.ndarray]:
    """Every blob of ``node``'s committed ``epoch``, read and checked through its record."""
    storage = get_registry().open_path(url)
    manifest = open_node(storage, node, epoch)
    io = ParallelIO(IOSettings())
    return read_blobs(storage, manifest, None, get_registry().db_type(db_type), io)


def assert_loads_exactly(
    url: str, epoch: int, db_type: str, salt: int = 0, node: str = NODE
) -> int:
    """``node``'s ``epoch`` loads and its blob is exactly :func:`weights` of its stored
    step; returns that step."""
    blobs = load_epoch(url, epoch, db_type, node)
    step = int(blobs["step"])
    np.testing.assert_array_equal(blobs["w"], weights(step, salt))
    return step
