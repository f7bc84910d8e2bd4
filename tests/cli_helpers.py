"""Helpers of the operator-command tests: calling the CLI in process, training a run."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ckptstore.checkpoint._multinode import MultiNodeCheckpointManager
from ckptstore.checkpoint._runner import JobRunner
from ckptstore.execution._job import Job, epoch_limiter
from ckptstore.execution._node import Node
from ckptstore.execution._session import LocalSession
from ckptstore.execution._task import Task
from ckptstore.testing.conformance import counting_job


@dataclass(frozen=True)
class Result:
    """What one ``ckptstore ...`` invocation did."""

    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


Cli = Callable[..., Result]


def train(url: str, epochs: int = 3, db_type: str = "npz") -> None:
    """Train the conformance kit's two-node job, committing epochs 0..``epochs``."""
    manager = MultiNodeCheckpointManager(url, db_type, metadata_handler="json")
    assert JobRunner(counting_job(epochs=epochs), manager).train(LocalSession()) == epochs


def train_with_limiter_outside_nodes(url: str, epochs: int = 2) -> None:
    """A two-node job whose ``epoch_limiter`` is created outside any ``Node``, as in
    Caffe2: its counter lives on the default node ``local``, a third node checkpoint."""
    with Job() as job:
        for node in ("trainer_0", "trainer_1"):
            with Node(node):
                with job.init_group:
                    Task(lambda ws: ws.update(w=np.zeros(4)), name="init")
                Task(lambda ws: ws["w"].__iadd__(1.0), name="train")
        epoch_limiter(job, epochs)
    manager = MultiNodeCheckpointManager(url, "npz")
    assert JobRunner(job, manager).train(LocalSession()) == epochs
