"""A small deterministic job for the metadata-handler and upload-builder tests.

Every node ``trainer_<k>`` holds ``trainer_<k>/w`` (float32, 64 values) and
``trainer_<k>/step``; each epoch adds ``k + 1`` to ``w`` and 1 to ``step``, so the state
after epoch ``e`` is known exactly. The epoch counter lives on the first node and is
checkpointed: a job resumed after its last epoch runs exactly one more.

Example::

    >>> from ckptstore import JobRunner, LocalSession, MultiNodeCheckpointManager
    >>> job = counting_job(("trainer_0", "trainer_1"), epochs=3)
    >>> manager = MultiNodeCheckpointManager("ckpt", "npz")
    >>> JobRunner(job, manager).train(LocalSession())
    3
    >>> set(expected_state("trainer_1", 3, ("trainer_0", "trainer_1"))["trainer_1/w"].tolist())
    {6.0}
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np

from ckptstore.execution import Job, Node, Task, Workspace, epoch_limiter

__all__ = ["NODES", "counting_job", "expected_state"]

NODES = ("trainer_0", "trainer_1")


def _init(ws: Workspace, *, node: str) -> None:
    ws[f"{node}/w"] = np.zeros(64, dtype=np.float32)
    ws[f"{node}/step"] = np.array(0, dtype=np.int64)


def _epoch(ws: Workspace, *, node: str, increment: float) -> None:
    ws[f"{node}/w"] += increment
    ws[f"{node}/step"] += 1


def counting_job(nodes: Sequence[str] = NODES, epochs: int = 3) -> Job:
    """A job over ``nodes`` that runs ``epochs`` epochs."""
    with Job() as job:
        for index, node in enumerate(nodes):
            with Node(node):
                with job.init_group:
                    Task(partial(_init, node=node), name=f"{node}/init")
                Task(partial(_epoch, node=node, increment=float(index + 1)), name=f"{node}/epoch")
        with Node(nodes[0]):
            epoch_limiter(job, epochs)
    return job


def expected_state(node: str, epoch: int, nodes: Sequence[str] = NODES) -> dict[str, Any]:
    """The blobs of ``node`` after ``epoch`` epochs."""
    increment = float(list(nodes).index(node) + 1)
    return {
        f"{node}/w": np.full(64, increment * epoch, dtype=np.float32),
        f"{node}/step": np.array(epoch, dtype=np.int64),
    }
