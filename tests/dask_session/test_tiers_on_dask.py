"""Several roots under DaskSession: the workers save and the driver commits on the first
root; the background copies to the later roots run in the driver (see docs/tiers.md,
"Where the copies run")."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from pathlib import Path

from ckpt_helpers import RecordingHandler
from dask_session.jobs import NODES, caffe2_job
from distributed import Client

from ckptstore import JobRunner, MultiNodeCheckpointManager
from ckptstore.dask_session import DaskSession
from ckptstore.protocol import CommitListing
from ckptstore.records import NodeStats


class CopyReports(RecordingHandler):
    """Records the process and thread each copy was reported from."""

    def __init__(self) -> None:
        super().__init__()
        self.copies: list[tuple[int, str]] = []

    def report(self, action_name: str, stats: Mapping[str, NodeStats]) -> None:
        if action_name == "checkpoint_copy":
            self.copies.append((os.getpid(), threading.current_thread().name))


def test_the_driver_copies_every_committed_epoch_to_the_later_root(
    tmp_path: Path, client: Client
) -> None:
    fast, durable = tmp_path / "fast", tmp_path / "durable"
    reports = CopyReports()
    manager = MultiNodeCheckpointManager([str(fast), str(durable)], "npz", reports)
    assert manager.tiers is not None
    manager.tiers.copy_every_epoch = True
    with DaskSession(client) as session:
        runner = JobRunner(caffe2_job(), manager)
        last = runner.train(session)
    later = manager.tiers.read_locations()[1].storage
    assert CommitListing.of(later).complete(NODES) == runner.committed_epochs
    assert runner.committed_epochs[-1] == last
    assert reports.copies
    assert set(reports.copies) == {(os.getpid(), "ckptstore-tiers")}
