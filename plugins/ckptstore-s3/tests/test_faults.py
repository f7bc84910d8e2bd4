"""Faults between ckptstore and S3, injected by a real HTTP proxy in front of moto:
throttling, dropped connections, stalled requests and the server going away mid-save.
A save either completes after retries or is not committed; resume never picks an
uncommitted epoch; a failure names the URL, the object and what to check."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
from ckptstore_s3 import S3Path

from ckptstore import (
    CheckpointManager,
    JobRunner,
    LocalSession,
    MultiNodeCheckpointManager,
    Node,
    SaveFailedError,
    TooManySaveFailuresError,
)
from ckptstore import commit as protocol
from ckptstore.testing import FaultProxy, wait_for
from ckptstore.testing.conformance import NODES, counting_job, expected_state

FAST = {"retry_base_delay": 0.01, "retry_max_delay": 0.05}


def node_session(blobs: dict[str, np.ndarray[Any, Any]]) -> LocalSession:
    session = LocalSession()
    session.workspace("trainer_0").update(blobs)
    return session


def saver(url: str, session: LocalSession, **options: Any) -> CheckpointManager:
    manager = CheckpointManager(url, "trainer_0", "npz", storage_options={**FAST, **options})
    with Node("trainer_0"):
        session.run(manager.init(["trainer_0"]))
    return manager


def reload(manager: CheckpointManager, session: LocalSession, epoch: int) -> dict[str, Any]:
    workspace = session.workspace("trainer_0")
    names = list(workspace)
    for name in names:
        workspace[name] = np.zeros(1)
    session.run(manager.load(epoch))
    return {name: workspace[name] for name in names}


BLOBS: dict[str, np.ndarray[Any, Any]] = {
    "big": np.arange(3 << 20, dtype=np.float32),  # 12 MiB: three 5 MiB parts
    "small": np.arange(100, dtype=np.int64),
}


def assert_blobs(found: dict[str, Any]) -> None:
    for name, value in BLOBS.items():
        assert np.array_equal(found[name], value), name


@pytest.mark.parametrize("status", [503, 500, 429])
def test_throttled_parts_are_retried_until_the_save_completes(
    s3_url: str, s3_faults: FaultProxy, status: int
) -> None:
    session = node_session(dict(BLOBS))
    manager = saver(s3_url, session, part_size=5 << 20)
    s3_faults.fail_next(4, status=status, methods={"PUT"}, after=1)  # parts, mid-upload
    session.run(manager.save(1))
    assert s3_faults.count("PUT", outcome="failed") == 4
    assert_blobs(reload(manager, session, 1))


def test_dropped_connections_on_writes_and_reads_are_retried(
    s3_url: str, s3_faults: FaultProxy
) -> None:
    session = node_session(dict(BLOBS))
    manager = saver(s3_url, session, part_size=5 << 20)
    s3_faults.reset_next(3, methods={"PUT"}, after=1)
    session.run(manager.save(1))
    s3_faults.reset_next(3, methods={"GET"}, after=2)
    assert_blobs(reload(manager, session, 1))
    assert s3_faults.count(outcome="reset") == 6


def test_stalled_requests_time_out_and_are_retried(s3_url: str, s3_faults: FaultProxy) -> None:
    session = node_session(dict(BLOBS))
    manager = saver(s3_url, session, part_size=5 << 20, read_timeout=0.5)
    s3_faults.stall_next(2, seconds=5, methods={"PUT"}, after=1)
    session.run(manager.save(1))
    s3_faults.stall_next(1, seconds=5, methods={"GET"})
    assert_blobs(reload(manager, session, 1))


def test_exhausted_retries_leave_the_epoch_uncommitted_and_say_why(
    s3_url: str, s3_faults: FaultProxy
) -> None:
    session = node_session(dict(BLOBS))
    manager = saver(s3_url, session, part_size=5 << 20, retries=2)
    session.run(manager.save(1))
    s3_faults.fail_next(1000, status=503, methods={"PUT"}, path="/trainer_0.2/")
    with pytest.raises(SaveFailedError) as caught:
        session.run(manager.save(2))
    message = str(caught.value)
    assert "epoch 2 was not committed under " + s3_url in message
    assert f"{s3_url}/trainer_0.2/blobs.npz" in message  # the object
    assert "SlowDown" in message
    assert "after 3 attempts" in message
    assert "kept throttling" in message
    assert "max_concurrency" in message
    storage = manager.location.storage
    assert protocol.committed_nodes(storage, 2) == set()
    assert protocol.committed_nodes(storage, 1) == {"trainer_0"}
    s3_faults.clear_faults()
    assert_blobs(reload(manager, session, 1))


def test_a_failed_commit_record_write_leaves_the_epoch_invisible_to_resume(
    s3_url: str, s3_faults: FaultProxy
) -> None:
    job = counting_job(epochs=2)
    manager = MultiNodeCheckpointManager(s3_url, "npz", "json", storage_options=FAST)
    runner = JobRunner(job, manager, save_retries=0, retry_backoff=0)
    s3_faults.fail_next(1000, status=503, methods={"PUT"}, path="epoch-2.commit.json")
    runner.train(LocalSession())
    assert runner.committed_epochs == [0, 1]
    assert [failure.epoch for failure in runner.save_failures] == [2]
    storage = manager.location.storage
    assert storage.exists("trainer_0.2/ckptstore.manifest.json")  # data landed ...
    assert protocol.read_commit(storage, 2) is None  # ... but was never committed

    s3_faults.clear_faults()
    session = LocalSession()
    resumed = JobRunner(counting_job(epochs=2), MultiNodeCheckpointManager(s3_url, "npz", "json"))
    assert resumed.train(session) == 2  # resumed from 1, not from the uncommitted 2
    for node in NODES:
        for name, value in expected_state(node, 2).items():
            assert np.array_equal(session.workspace(node)[name], value)
    assert s3_faults.listings() == []


def test_server_gone_mid_save_then_back_completes_the_save(
    s3_url: str, s3_faults: FaultProxy
) -> None:
    session = node_session(dict(BLOBS))
    manager = saver(s3_url, session, part_size=5 << 20, retries=12)
    s3_faults.outage_after(2, methods={"PUT"})
    errors: list[BaseException] = []

    def save() -> None:
        try:
            session.run(manager.save(1))
        except BaseException as error:
            errors.append(error)

    thread = threading.Thread(target=save)
    thread.start()
    wait_for(lambda: s3_faults.count(outcome="unreachable") >= 4, timeout=60, what="retries")
    s3_faults.restore()
    thread.join(timeout=120)
    assert not thread.is_alive()
    assert errors == []
    assert protocol.committed_nodes(manager.location.storage, 1) == {"trainer_0"}
    assert_blobs(reload(manager, session, 1))


def test_server_gone_for_good_mid_save_is_not_committed_and_resume_skips_it(
    s3_url: str, s3_faults: FaultProxy
) -> None:
    manager = MultiNodeCheckpointManager(
        s3_url, "npz", "json", storage_options={**FAST, "retries": 2}
    )
    runner = JobRunner(
        counting_job(epochs=3),
        manager,
        save_retries=0,
        retry_backoff=0,
        max_consecutive_save_failures=1,
    )
    s3_faults.outage_after(1, methods={"PUT"}, path="/trainer_1.2/")
    with pytest.raises(TooManySaveFailuresError, match="epoch 2 was not committed"):
        runner.train(LocalSession())
    assert runner.committed_epochs == [0, 1]
    reason = str(runner.save_failures[0].error)
    assert "trainer_1.2/blobs.npz" in reason
    assert "check that it is up and reachable" in reason
    s3_faults.restore()
    storage = S3Path(s3_url)
    assert protocol.read_commit(storage, 2) is None
    assert storage.exists("trainer_0.2/ckptstore.manifest.json")  # the other node's save

    session = LocalSession()
    resumed = JobRunner(counting_job(epochs=3), MultiNodeCheckpointManager(s3_url, "npz", "json"))
    assert resumed.train(session) == 3  # from epoch 1: epochs 2 and 3 run again
    assert resumed.committed_epochs == [2, 3]
    for node in NODES:
        for name, value in expected_state(node, 3).items():
            assert np.array_equal(session.workspace(node)[name], value)
