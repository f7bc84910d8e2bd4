"""Faults between ckptstore and GCS: throttling and dropped connections injected by a
real HTTP proxy, and the emulator process itself stopped in the middle of a save and
started again (its objects kept on disk). A save either completes after retries or is
not committed; resume never picks an uncommitted epoch; a failure names the URL, the
object and what to check."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ckptstore_gcs import GCSPath

from ckptstore import (
    CheckpointManager,
    JobRunner,
    LocalSession,
    MultiNodeCheckpointManager,
    Node,
    SaveFailedError,
)
from ckptstore import commit as protocol
from ckptstore.testing import FaultProxy, GcsEmulator, wait_for
from ckptstore.testing.conformance import NODES, counting_job, expected_state

FAST = {"retry_base_delay": 0.02, "retry_max_delay": 0.2}
BLOBS: dict[str, np.ndarray[Any, Any]] = {
    "big": np.arange(1 << 20, dtype=np.float32),  # 4 MiB: four 1 MiB parts
    "small": np.arange(100, dtype=np.int64),
}


def saver(url: str, session: LocalSession, **options: Any) -> CheckpointManager:
    session.workspace("trainer_0").update(dict(BLOBS))
    manager = CheckpointManager(
        url, "trainer_0", "npz", storage_options={**FAST, "part_size": 1 << 20, **options}
    )
    with Node("trainer_0"):
        session.run(manager.init(["trainer_0"]))
    return manager


def assert_reloads(manager: CheckpointManager, epoch: int) -> None:
    session = LocalSession()
    with Node("trainer_0"):
        session.run(manager.init(["trainer_0"], retrieve_from_epoch=epoch))
    session.run(manager.load(epoch))
    for name, value in BLOBS.items():
        assert np.array_equal(session.workspace("trainer_0")[name], value), name


@pytest.mark.parametrize("status", [503, 429])
def test_throttled_uploads_are_retried_until_the_save_completes(
    gcs_url: str, gcs_faults: FaultProxy, status: int
) -> None:
    session = LocalSession()
    manager = saver(gcs_url, session)
    gcs_faults.fail_next(4, status=status, methods={"POST"}, after=1)
    session.run(manager.save(1))
    assert gcs_faults.count("POST", outcome="failed") == 4
    assert_reloads(manager, 1)


def test_dropped_connections_are_retried(gcs_url: str, gcs_faults: FaultProxy) -> None:
    session = LocalSession()
    manager = saver(gcs_url, session)
    gcs_faults.reset_next(3, methods={"POST"}, after=1)
    session.run(manager.save(1))
    gcs_faults.reset_next(2, methods={"GET"}, after=1)
    assert_reloads(manager, 1)
    assert gcs_faults.count(outcome="reset") == 5


def test_exhausted_retries_leave_the_epoch_uncommitted_and_say_why(
    gcs_url: str, gcs_faults: FaultProxy
) -> None:
    session = LocalSession()
    manager = saver(gcs_url, session, retries=2)
    gcs_faults.fail_next(1000, status=503, methods={"POST"})
    with pytest.raises(SaveFailedError) as caught:
        session.run(manager.save(1))
    message = str(caught.value)
    assert f"{gcs_url}/trainer_0.1/blobs.npz" in message
    assert "after 3 attempts" in message
    assert "kept throttling" in message
    gcs_faults.clear_faults()
    assert protocol.read_commit(manager.location.storage, 1) is None


@pytest.fixture
def restartable(tmp_path: Path) -> Iterator[tuple[GcsEmulator, FaultProxy, str]]:
    """An emulator keeping its objects on disk, behind a proxy that records requests."""
    with GcsEmulator(data_dir=tmp_path / "gcs") as server:
        server.create_bucket("restart")
        with FaultProxy(server.endpoint_url, flavour="gcs") as proxy:
            yield server, proxy, "gs://restart/run"


def test_emulator_stopped_mid_save_then_restarted_completes_the_save(
    restartable: tuple[GcsEmulator, FaultProxy, str],
) -> None:
    server, proxy, url = restartable
    session = LocalSession()
    manager = saver(url, session, endpoint_url=proxy.endpoint_url, retries=100, retry_max_delay=0.5)
    session.run(manager.save(1))
    proxy.stall_next(1, seconds=120, methods={"POST"}, after=2)  # hold the third upload
    errors: list[BaseException] = []

    def save() -> None:
        try:
            session.run(manager.save(2))
        except BaseException as error:
            errors.append(error)

    thread = threading.Thread(target=save)
    thread.start()
    wait_for(lambda: proxy.holding == 1, timeout=60, what="the save to reach its third upload")
    server.stop()
    proxy.release()
    wait_for(lambda: proxy.count(outcome="unreachable") >= 3, timeout=60, what="failed retries")
    server.start()
    thread.join(timeout=120)
    assert not thread.is_alive()
    assert errors == []
    assert protocol.committed_nodes(manager.location.storage, 2) == {"trainer_0"}
    assert_reloads(manager, 2)
    assert_reloads(manager, 1)


def test_emulator_stopped_for_good_mid_save_is_not_committed_and_resume_skips_it(
    restartable: tuple[GcsEmulator, FaultProxy, str],
) -> None:
    server, proxy, url = restartable
    options = {**FAST, "endpoint_url": proxy.endpoint_url, "retries": 2}
    manager = MultiNodeCheckpointManager(url, "npz", "json", storage_options=options)
    runner = JobRunner(counting_job(epochs=2), manager, save_retries=0, retry_backoff=0)
    proxy.stall_next(1, seconds=120, methods={"POST"}, path="trainer_1.2")
    errors: list[BaseException] = []

    def train() -> None:
        try:
            runner.train(LocalSession())
        except BaseException as error:
            errors.append(error)

    thread = threading.Thread(target=train)
    thread.start()
    wait_for(lambda: proxy.holding == 1, timeout=60, what="the save of epoch 2")
    server.stop()
    proxy.release()
    thread.join(timeout=120)
    assert not thread.is_alive()
    assert errors == []
    assert runner.committed_epochs == [0, 1]
    assert [failure.epoch for failure in runner.save_failures] == [2]
    assert "check that it is up and reachable" in str(runner.save_failures[0].error)

    server.start()  # back, with everything written before it stopped
    storage = GCSPath(url, endpoint_url=server.endpoint_url)
    assert protocol.read_commit(storage, 2) is None
    session = LocalSession()
    resumed = JobRunner(
        counting_job(epochs=2),
        MultiNodeCheckpointManager(
            url, "npz", "json", storage_options={"endpoint_url": server.endpoint_url}
        ),
    )
    assert resumed.train(session) == 2  # from epoch 1: the uncommitted epoch 2 runs again
    for node in NODES:
        for name, value in expected_state(node, 2).items():
            assert np.array_equal(session.workspace(node)[name], value)
