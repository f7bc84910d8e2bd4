"""The GCS emulator process itself stopped in the middle of a save and started again
(its objects kept on disk): a save either completes after retries or is not committed,
and resume never picks an uncommitted epoch. Faults injected by the proxy are in
``test_scenarios.py``."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from ckptstore_gcs import GCSPath

from ckptstore import JobRunner, LocalSession, MultiNodeCheckpointManager, protocol
from ckptstore.testing import FaultProxy, GcsEmulator, wait_for
from ckptstore.testing.conformance import counting_job
from ckptstore.testing.object_store import StoreUnderTest
from ckptstore.testing.object_store.store import FAST, assert_blobs, assert_state, reload, saver


@pytest.fixture
def restartable(tmp_path: Path) -> Iterator[tuple[GcsEmulator, StoreUnderTest]]:
    """An emulator keeping its objects on disk, behind a proxy that records requests."""
    with GcsEmulator(data_dir=tmp_path / "gcs") as server:
        server.create_bucket("restart")
        with FaultProxy(server.endpoint_url, flavour="gcs") as proxy:
            yield (
                server,
                StoreUnderTest(
                    path_type=GCSPath,
                    url="gs://restart/run",
                    faults=proxy,
                    storage_options={"endpoint_url": proxy.endpoint_url},
                    environment=(),
                    part_size=1 << 20,
                ),
            )


def run_in_thread(work: Callable[[], object]) -> tuple[threading.Thread, list[BaseException]]:
    """``work()`` started in a thread; the list collects what it raised."""
    errors: list[BaseException] = []

    def guarded() -> None:
        try:
            work()
        except BaseException as error:
            errors.append(error)

    thread = threading.Thread(target=guarded)
    thread.start()
    return thread, errors


def test_emulator_stopped_mid_save_then_restarted_completes_the_save(
    restartable: tuple[GcsEmulator, StoreUnderTest],
) -> None:
    server, store = restartable
    proxy = store.faults
    session = LocalSession()
    manager = saver(store, session, **store.storage_options, retries=100, retry_max_delay=0.5)
    session.run(manager.save(1))
    proxy.stall_next(1, seconds=120, methods={"POST"}, after=2)  # hold the third upload
    thread, errors = run_in_thread(lambda: session.run(manager.save(2)))
    wait_for(lambda: proxy.holding == 1, timeout=60, what="the save to reach its third upload")
    server.stop()
    proxy.release()
    wait_for(lambda: proxy.count(outcome="unreachable") >= 3, timeout=60, what="failed retries")
    server.start()
    thread.join(timeout=120)
    assert not thread.is_alive()
    assert errors == []
    assert protocol.committed_nodes(manager.location.storage, 2) == {"trainer_0"}
    assert_blobs(store, reload(manager, session, 2))
    assert_blobs(store, reload(manager, session, 1))


def test_emulator_stopped_for_good_mid_save_is_not_committed_and_resume_skips_it(
    restartable: tuple[GcsEmulator, StoreUnderTest],
) -> None:
    server, store = restartable
    proxy = store.faults
    options = {**FAST, **store.storage_options, "retries": 2}
    manager = MultiNodeCheckpointManager(store.url, "npz", "json", storage_options=options)
    runner = JobRunner(counting_job(epochs=2), manager, save_retries=0, retry_backoff=0)
    proxy.stall_next(1, seconds=120, methods={"POST"}, path="trainer_1.2")
    thread, errors = run_in_thread(lambda: runner.train(LocalSession()))
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
    direct = {"endpoint_url": server.endpoint_url}
    assert protocol.read_commit(GCSPath(store.url, **direct), 2) is None
    session = LocalSession()
    resumed = JobRunner(
        counting_job(epochs=2),
        MultiNodeCheckpointManager(store.url, "npz", "json", storage_options=direct),
    )
    assert resumed.train(session) == 2  # from epoch 1: the uncommitted epoch 2 runs again
    assert_state(session, 2)
