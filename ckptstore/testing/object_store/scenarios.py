"""The scenarios every object store must survive, against its real server behind a
fault proxy: whole jobs saved and resumed without listing, two-tier uploads,
throttling, dropped and stalled connections, exhausted retries, outages.

Each scenario is a test method taking the ``store`` fixture (a
:class:`~ckptstore.testing.object_store.store.StoreUnderTest`), so a plugin adds its own
the same way.

Example::

    >>> import contextlib, io, pytest
    >>> tests = '''
    ... from ckptstore import LocalSession
    ... from ckptstore.testing.object_store import ObjectStoreScenarios
    ... from ckptstore.testing.object_store.store import assert_blobs, reload, saver
    ... from ckptstore_s3 import S3Path
    ...
    ... class TestS3Scenarios(ObjectStoreScenarios):
    ...     path_type = S3Path
    ...     server = "s3"
    ...     environment = ("AWS_ENDPOINT_URL_S3",)
    ...     part_size = 5 << 20
    ...
    ...     def test_large_blobs_go_up_in_parts(self, store):
    ...         session = LocalSession()
    ...         manager = saver(store, session)
    ...         session.run(manager.save(1))
    ...         assert_blobs(store, reload(manager, session, 1))
    ... '''
    >>> _ = open("test_s3_scenarios.py", "w").write(tests)
    >>> with contextlib.redirect_stdout(io.StringIO()) as out:  # i.e. run pytest
    ...     code = pytest.main(["-q", "test_s3_scenarios.py", "-k", "large_blobs_go_up_in_parts"])
    >>> int(code), out.getvalue().splitlines()[-1]
    (0, '1 passed...')
"""

from __future__ import annotations

import re
import shutil
import threading
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from ckptstore import protocol
from ckptstore.builtin import CopyUpload
from ckptstore.checkpoint import CheckpointManager, JobRunner, MultiNodeCheckpointManager
from ckptstore.errors import AlreadyCommittedError, SaveFailedError, TooManySaveFailuresError
from ckptstore.execution import LocalSession, Node
from ckptstore.paths import LocalPath
from ckptstore.plugin import PathType
from ckptstore.records import MANIFEST_NAME, manifest_key
from ckptstore.testing.conformance import NODES, counting_job, expected_state, flip_byte
from ckptstore.testing.object_store.store import (
    FAST,
    OnObjectStore,
    StoreUnderTest,
    assert_blobs,
    assert_state,
    object_store_db_types,
    reload,
    saver,
)
from ckptstore.testing.proxy import FaultProxy, RecordedRequest
from ckptstore.testing.servers import wait_for

__all__ = ["ObjectStoreScenarios"]


def _data_key(storage: PathType, node: str, epoch: int) -> str:
    """Where ``node``'s committed checkpoint of ``epoch`` keeps its files."""
    record = protocol.read_commit(storage, epoch, [node])
    assert record is not None
    return record.nodes[node].data_key


def _manifests(storage: PathType, db_key: str) -> list[str]:
    """The manifests of every attempt of ``db_key`` (``trainer_0.2``)."""
    return [key for key in storage.list_keys(db_key) if key.endswith(f"/{MANIFEST_NAME}")]


def outside_control_directory(listings: list[RecordedRequest]) -> list[RecordedRequest]:
    """The listings of anything but a run's control directory: resume and retention
    list only ``_ckptstore/`` (the commit records decide), saves list nothing."""
    return [request for request in listings if "_ckptstore" not in request.query]


class ObjectStoreScenarios(OnObjectStore):
    """Jobs, uploads and faults on one object store, through a fault proxy.

    Class attributes (besides :class:`OnObjectStore`'s): ``environment``, the variables
    that point the server's URLs at it; ``part_size``, the smallest part it takes.

    Example::

        >>> import contextlib, io, pytest
        >>> tests = '''
        ... from ckptstore.testing.object_store import ObjectStoreScenarios
        ... from ckptstore_gcs import GCSPath
        ...
        ... class TestGCSScenarios(ObjectStoreScenarios):
        ...     path_type = GCSPath
        ...     server = "gcs"
        ...     environment = ("STORAGE_EMULATOR_HOST",)
        ...     part_size = 1 << 20
        ... '''
        >>> _ = open("test_gcs_scenarios.py", "w").write(tests)
        >>> with contextlib.redirect_stdout(io.StringIO()) as out:  # i.e. run pytest
        ...     selected = "fresh_root_per_test or check_db_exists"
        ...     code = pytest.main(["-q", "test_gcs_scenarios.py", "-k", selected])
        >>> int(code), out.getvalue().splitlines()[-1]
        (0, '2 passed...')
    """

    environment: ClassVar[tuple[str, ...]]
    part_size: ClassVar[int]

    @pytest.fixture
    def store(self, request: pytest.FixtureRequest) -> StoreUnderTest:
        # the proxy first: the URL and options fixtures then point through it
        faults: FaultProxy = request.getfixturevalue(f"{self.server}_faults")
        return StoreUnderTest(
            path_type=self.path_type,
            url=request.getfixturevalue(f"{self.server}_url"),
            faults=faults,
            storage_options=request.getfixturevalue(f"{self.server}_storage_options"),
            environment=self.environment,
            part_size=self.part_size,
        )

    # -- jobs -------------------------------------------------------------------------

    @pytest.mark.parametrize("db_name", object_store_db_types())
    def test_a_job_saves_every_epoch_and_resumes_without_listing(
        self, store: StoreUnderTest, db_name: str
    ) -> None:
        manager = MultiNodeCheckpointManager(store.url, db_name, "json")
        runner = JobRunner(counting_job(epochs=2), manager)
        assert runner.train(LocalSession()) == 2
        assert runner.committed_epochs == [0, 1, 2]
        assert store.faults.count(store.api.upload_method) > 0

        session = LocalSession()  # the limit raised to 3: it resumes after epoch 2
        manager = MultiNodeCheckpointManager(store.url, db_name, "json")
        resumed = JobRunner(counting_job(epochs=3), manager)
        assert resumed.train(session) == 3
        assert resumed.committed_epochs == [3]
        assert_state(session, 3)
        assert outside_control_directory(store.faults.listings()) == []
        assert store.faults.count("GET") > 0

    @pytest.mark.parametrize("db_name", object_store_db_types())
    def test_every_epoch_loads_back_exactly(self, store: StoreUnderTest, db_name: str) -> None:
        manager = MultiNodeCheckpointManager(store.url, db_name)
        JobRunner(counting_job(epochs=3), manager).train(LocalSession())
        for epoch in range(4):
            session = LocalSession()
            session.run(manager.load(epoch))
            assert_state(session, epoch)
        storage = manager.location.storage
        assert isinstance(storage, store.path_type)
        assert protocol.committed_nodes(storage, 3) == set(NODES)

    def test_settings_from_storage_options_alone(
        self, store: StoreUnderTest, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        for variable in store.environment:
            monkeypatch.delenv(variable)
        manager = MultiNodeCheckpointManager(
            store.url, "npz", storage_options=store.storage_options
        )
        JobRunner(counting_job(epochs=1), manager).train(LocalSession())
        session = LocalSession()
        session.run(manager.load(1))
        assert_state(session, 1)

    def test_resaving_an_epoch_in_place_replaces_it(self, store: StoreUnderTest) -> None:
        session = LocalSession()
        workspace = session.workspace("trainer_0")
        workspace["a"] = np.arange(10.0)
        workspace["b"] = np.ones(3)
        manager = CheckpointManager(store.url, "trainer_0", "npz")
        with Node("trainer_0"):
            session.run(manager.init(["trainer_0"]))
        session.run(manager.save(1))
        workspace["a"] = np.arange(10.0) * 2
        with pytest.raises(AlreadyCommittedError):  # write-once unless asked
            session.run(manager.save(1))
        manager.overwrite = True  # replacing committed epoch 1 on purpose
        session.run(manager.save(1))
        workspace["a"] = np.zeros(1)
        session.run(manager.load(1))
        assert np.array_equal(workspace["a"], np.arange(10.0) * 2)

    def test_check_db_exists_and_partial_loads(self, store: StoreUnderTest) -> None:
        runner = JobRunner(counting_job(epochs=2), MultiNodeCheckpointManager(store.url, "npz"))
        runner.train(LocalSession())
        session = LocalSession()
        wanted = [f"{node}/w" for node in NODES]
        assert runner.load_blobs_from_checkpoints(wanted, 2, session)
        for node in NODES:
            assert np.array_equal(
                session.workspace()[f"{node}/w"], expected_state(node, 2)[f"{node}/w"]
            )
        assert not runner.load_blobs_from_checkpoints(wanted, 7, session)
        exists = CheckpointManager(store.url, "trainer_0", "npz").check_db_exists(2)
        LocalSession().run(exists)
        assert exists.outputs()[0].fetch() is True

    def test_a_fresh_root_per_test(self, store: StoreUnderTest) -> None:
        storage = store.path_type(store.url)
        assert storage.list_keys() == []
        session = LocalSession()
        session.workspace("trainer_0")["x"] = np.arange(5)
        manager = CheckpointManager(store.url, "trainer_0", "npz")
        with Node("trainer_0"):
            session.run(manager.init(["trainer_0"]))
        session.run(manager.save(0))
        assert manifest_key(_data_key(storage, "trainer_0", 0)) in storage.list_keys()

    def test_accessible_reads_bucket_metadata_only(self, store: StoreUnderTest) -> None:
        assert store.path_type(store.url).accessible()
        missing = store.url.replace("://", "://no-such-bucket-", 1)
        assert not store.path_type(missing, retries=0).accessible()
        assert {r.method for r in store.faults.requests} == {store.api.bucket_check_method}
        assert store.faults.listings() == []

    # -- two tiers --------------------------------------------------------------------

    @pytest.mark.parametrize("db_name", object_store_db_types())
    def test_the_final_epoch_is_uploaded_and_restores_from_either_tier(
        self, store: StoreUnderTest, tmp_path: Path, db_name: str
    ) -> None:
        local = str(tmp_path / "fast")
        manager = MultiNodeCheckpointManager(local, db_name, "json")
        upload = CopyUpload(store.url)
        runner = JobRunner(counting_job(epochs=3), manager, upload_task_group_builder=upload)
        assert runner.train(LocalSession()) == 3
        assert runner.committed_epochs == [0, 1, 2, 3]  # every epoch saved locally

        remote = store.path_type(store.url)
        assert protocol.committed_nodes(remote, 3, NODES) == set(NODES)
        assert protocol.read_commit(remote, 2, NODES) is None  # only the final epoch goes up
        local_record = protocol.read_commit(LocalPath(local), 3, NODES)
        remote_record = protocol.read_commit(remote, 3, NODES)
        assert local_record is not None
        assert remote_record is not None
        for node in NODES:  # the very same manifests, byte for byte
            local_crc = local_record.nodes[node].manifest_crc32c
            assert remote_record.nodes[node].manifest_crc32c == local_crc

        uploads = store.faults.uploads()
        records = sorted(f"/_ckptstore/epoch-3/{node}.commit.json" for node in NODES)
        last = uploads[-len(NODES) :]  # the nodes' commit records are written last ...
        assert sorted(target[target.index("/_ckptstore/") :] for target in last) == records
        assert sum(target.endswith(tuple(records)) for target in uploads) == len(NODES)  # once
        assert outside_control_directory(store.faults.listings()) == []

        from_local = LocalSession()
        from_local.run(manager.load(3))
        assert_state(from_local, 3)
        shutil.rmtree(local)  # the fast tier is gone: the object store still has it
        from_remote = LocalSession()
        from_remote.run(manager.load(3, path_prefix=store.url))
        assert_state(from_remote, 3)

    def test_an_upload_through_throttling_and_resets_completes(
        self, store: StoreUnderTest, tmp_path: Path
    ) -> None:
        upload = CopyUpload(store.url, storage_options={"retry_base_delay": 0.01})
        manager = MultiNodeCheckpointManager(str(tmp_path), "npz")
        store.faults.fail_next(3, status=503, methods={store.api.upload_method})
        store.faults.reset_next(2, methods={"GET", "HEAD"})
        JobRunner(counting_job(epochs=2), manager, upload_task_group_builder=upload).train(
            LocalSession()
        )
        assert protocol.committed_nodes(store.path_type(store.url), 2) == set(NODES)
        assert store.faults.count(outcome="failed") == 3

    def test_a_corrupt_local_checkpoint_is_not_uploaded(
        self, store: StoreUnderTest, tmp_path: Path
    ) -> None:
        local = str(tmp_path / "fast")
        manager = MultiNodeCheckpointManager(local, "npz")
        JobRunner(counting_job(epochs=2), manager).train(LocalSession())
        flip_byte(LocalPath(local), f"{_data_key(LocalPath(local), 'trainer_1', 2)}/blobs.npz", 200)
        session = LocalSession()
        with pytest.raises(ValueError, match=r"checksum \(crc32\)"):
            session.run(CopyUpload(store.url).build(2, manager))
        assert protocol.read_commit(store.path_type(store.url), 2) is None

    # -- faults -----------------------------------------------------------------------

    @pytest.mark.parametrize("status", [503, 500, 429])
    def test_throttled_uploads_are_retried_until_the_save_completes(
        self, store: StoreUnderTest, status: int
    ) -> None:
        session = LocalSession()
        manager = saver(store, session)
        store.faults.fail_next(4, status=status, methods={store.api.upload_method}, after=1)
        session.run(manager.save(1))
        assert store.faults.count(store.api.upload_method, outcome="failed") == 4
        assert_blobs(store, reload(manager, session, 1))

    def test_dropped_connections_on_writes_and_reads_are_retried(
        self, store: StoreUnderTest
    ) -> None:
        session = LocalSession()
        manager = saver(store, session)
        store.faults.reset_next(3, methods={store.api.upload_method}, after=1)
        session.run(manager.save(1))
        store.faults.reset_next(3, methods={"GET"}, after=2)
        assert_blobs(store, reload(manager, session, 1))
        assert store.faults.count(outcome="reset") == 6

    def test_stalled_requests_time_out_and_are_retried(self, store: StoreUnderTest) -> None:
        session = LocalSession()
        manager = saver(store, session, read_timeout=0.5)
        store.faults.stall_next(2, seconds=5, methods={store.api.upload_method}, after=1)
        session.run(manager.save(1))
        store.faults.stall_next(1, seconds=5, methods={"GET"})
        assert_blobs(store, reload(manager, session, 1))

    def test_exhausted_retries_leave_the_epoch_uncommitted_and_say_why(
        self, store: StoreUnderTest
    ) -> None:
        session = LocalSession()
        manager = saver(store, session, retries=2)
        session.run(manager.save(1))
        store.faults.fail_next(
            1000, status=503, methods={store.api.upload_method}, path="/trainer_0.2/"
        )
        with pytest.raises(SaveFailedError) as caught:
            session.run(manager.save(2))
        message = str(caught.value)
        assert "epoch 2 was not committed under " + store.url in message
        assert re.search(  # the object
            re.escape(f"{store.url}/trainer_0.2/attempt-") + r"[0-9a-f]{12}/blobs\.npz", message
        )
        assert store.api.throttling_reason in message
        assert "after 3 attempts" in message
        assert "kept throttling" in message
        assert "max_concurrency" in message
        assert protocol.committed_nodes(manager.location, 2) == set()
        assert protocol.committed_nodes(manager.location, 1) == {"trainer_0"}
        store.faults.clear_faults()
        assert_blobs(store, reload(manager, session, 1))

    def test_a_failed_commit_record_write_leaves_the_epoch_invisible_to_resume(
        self, store: StoreUnderTest
    ) -> None:
        manager = MultiNodeCheckpointManager(store.url, "npz", "json", storage_options=FAST)
        runner = JobRunner(counting_job(epochs=2), manager, save_retries=0, retry_backoff=0)
        store.faults.fail_next(
            1000, status=503, methods={store.api.upload_method}, path="_ckptstore/epoch-2/"
        )
        runner.train(LocalSession())
        assert runner.committed_epochs == [0, 1]
        assert [failure.epoch for failure in runner.save_failures] == [2]
        storage = manager.location.storage
        assert protocol.read_commit(storage, 2, NODES) is None  # never committed ...

        store.faults.clear_faults()
        session = LocalSession()
        resumed = JobRunner(
            counting_job(epochs=2), MultiNodeCheckpointManager(store.url, "npz", "json")
        )
        assert resumed.train(session) == 2  # resumed from 1, not from the uncommitted 2
        assert_state(session, 2)
        assert outside_control_directory(store.faults.listings()) == []
        assert _manifests(storage, "trainer_0.2")  # ... although its data landed

    def test_server_gone_mid_save_then_back_completes_the_save(self, store: StoreUnderTest) -> None:
        session = LocalSession()
        manager = saver(store, session, retries=12)
        store.faults.outage_after(2, methods={store.api.upload_method})
        errors: list[BaseException] = []

        def save() -> None:
            try:
                session.run(manager.save(1))
            except BaseException as error:
                errors.append(error)

        thread = threading.Thread(target=save)
        thread.start()
        unreachable = store.faults.count
        wait_for(lambda: unreachable(outcome="unreachable") >= 4, timeout=60, what="retries")
        store.faults.restore()
        thread.join(timeout=120)
        assert not thread.is_alive()
        assert errors == []
        assert protocol.committed_nodes(manager.location, 1) == {"trainer_0"}
        assert_blobs(store, reload(manager, session, 1))

    def test_server_gone_for_good_mid_save_is_not_committed_and_resume_skips_it(
        self, store: StoreUnderTest
    ) -> None:
        options = {**FAST, "retries": 2}
        manager = MultiNodeCheckpointManager(store.url, "npz", "json", storage_options=options)
        runner = JobRunner(
            counting_job(epochs=3),
            manager,
            save_retries=0,
            retry_backoff=0,
            max_consecutive_save_failures=1,
        )
        store.faults.outage_after(1, methods={store.api.upload_method}, path="/trainer_1.2/")
        with pytest.raises(TooManySaveFailuresError, match="epoch 2 was not committed"):
            runner.train(LocalSession())
        assert runner.committed_epochs == [0, 1]
        reason = str(runner.save_failures[0].error)
        assert re.search(r"trainer_1\.2/attempt-[0-9a-f]{12}/blobs\.npz", reason)
        assert "check that it is up and reachable" in reason
        store.faults.restore()
        storage = store.path_type(store.url)
        assert protocol.read_commit(storage, 2, NODES) is None
        assert _manifests(storage, "trainer_0.2")  # the other node's save

        session = LocalSession()
        resumed = JobRunner(
            counting_job(epochs=3), MultiNodeCheckpointManager(store.url, "npz", "json")
        )
        assert resumed.train(session) == 3  # from epoch 1: epochs 2 and 3 run again
        assert resumed.committed_epochs == [2, 3]
        assert_state(session, 3)
