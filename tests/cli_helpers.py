"""Helpers of the operator-command tests: calling the CLI in process, training a run."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ckptstore.checkpoint._multinode import MultiNodeCheckpointManager
from ckptstore.checkpoint._runner import JobRunner
from ckptstore.execution._session import LocalSession
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
