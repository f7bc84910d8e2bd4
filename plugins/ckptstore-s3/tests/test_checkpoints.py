"""Jobs checkpoint to ``s3://`` URLs with every object-store DB type, resume from the
catalog without listing the bucket, and take their settings from the environment or
from storage options, over real HTTP to a moto server."""

from __future__ import annotations

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
    Task,
    Workspace,
)
from ckptstore import commit as protocol
from ckptstore.plugin.registry import get_registry
from ckptstore.testing import FaultProxy
from ckptstore.testing.conformance import NODES, counting_job, expected_state

DB_TYPES = sorted(name for name, cls in get_registry().db_types.items() if not cls.needs_rename)


def assert_state(session: LocalSession, epoch: int) -> None:
    for node in NODES:
        for name, value in expected_state(node, epoch).items():
            assert np.array_equal(session.workspace(node)[name], value), (node, name)


@pytest.mark.parametrize("db_type", DB_TYPES)
def test_a_job_saves_every_epoch_and_resumes_without_listing(
    s3_url: str, s3_faults: FaultProxy, db_type: str
) -> None:
    runner = JobRunner(counting_job(epochs=3), MultiNodeCheckpointManager(s3_url, db_type, "json"))
    assert runner.train(LocalSession()) == 3
    assert runner.committed_epochs == [0, 1, 2, 3]
    assert s3_faults.count("PUT") > 0

    session = LocalSession()  # a job resumed after its last epoch runs one more
    resumed = JobRunner(counting_job(epochs=3), MultiNodeCheckpointManager(s3_url, db_type, "json"))
    assert resumed.train(session) == 4
    assert resumed.committed_epochs == [4]
    assert_state(session, 4)
    assert s3_faults.listings() == []
    assert s3_faults.count("GET") > 0


@pytest.mark.parametrize("db_type", DB_TYPES)
def test_every_epoch_loads_back_exactly(s3_url: str, db_type: str) -> None:
    manager = MultiNodeCheckpointManager(s3_url, db_type)
    JobRunner(counting_job(epochs=3), manager).train(LocalSession())
    for epoch in range(4):
        session = LocalSession()
        session.run(manager.load(epoch))
        assert_state(session, epoch)
    storage = manager.location.storage
    assert isinstance(storage, S3Path)
    assert protocol.committed_nodes(storage, 3) == set(NODES)


def test_large_blobs_go_up_as_parallel_multipart_uploads(
    s3_url: str, s3_faults: FaultProxy
) -> None:
    weights = np.random.default_rng(1).standard_normal(3 << 20).astype(np.float32)  # 12 MiB
    session = LocalSession()
    session.workspace("trainer_0")["w"] = weights
    manager = CheckpointManager(s3_url, "trainer_0", "npz", storage_options={"part_size": 5 << 20})
    with Node("trainer_0"):
        session.run(manager.init(["trainer_0"]))
    session.run(manager.save(1))
    part_uploads = [r for r in s3_faults.requests if r.method == "PUT" and "partNumber" in r.params]
    assert len(part_uploads) == 3  # 12 MiB of data in 5 MiB parts
    session.workspace("trainer_0")["w"] = np.zeros(1, dtype=np.float32)
    session.run(manager.load(1))
    assert np.array_equal(session.workspace("trainer_0")["w"], weights)


def test_settings_from_storage_options_alone(
    s3_url: str, s3_storage_options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID"):
        monkeypatch.delenv(variable)
    with pytest.raises(OSError, match="could not"):
        S3Path(s3_url, retries=0).read_bytes("anything")  # AWS itself: no credentials
    manager = MultiNodeCheckpointManager(s3_url, "npz", storage_options=s3_storage_options)
    JobRunner(counting_job(epochs=1), manager).train(LocalSession())
    session = LocalSession()
    session.run(manager.load(1))
    assert_state(session, 1)


def test_resaving_an_epoch_in_place_replaces_it(s3_url: str) -> None:
    session = LocalSession()
    workspace = session.workspace("trainer_0")
    workspace["a"] = np.arange(10.0)
    workspace["b"] = np.ones(3)
    manager = CheckpointManager(s3_url, "trainer_0", "npz")
    with Node("trainer_0"):
        session.run(manager.init(["trainer_0"]))
    session.run(manager.save(1))
    workspace["a"] = np.arange(10.0) * 2
    session.run(manager.save(1))
    workspace["a"] = np.zeros(1)
    session.run(manager.load(1))
    assert np.array_equal(workspace["a"], np.arange(10.0) * 2)


def test_check_db_exists_and_partial_loads(s3_url: str) -> None:
    manager = MultiNodeCheckpointManager(s3_url, "npz")
    runner = JobRunner(counting_job(epochs=2), manager)
    runner.train(LocalSession())
    session = LocalSession()
    wanted = [f"{node}/w" for node in NODES]
    assert runner.load_blobs_from_checkpoints(wanted, 2, session)
    for node in NODES:
        assert np.array_equal(
            session.workspace()[f"{node}/w"], expected_state(node, 2)[f"{node}/w"]
        )
    assert not runner.load_blobs_from_checkpoints(wanted, 7, session)
    single = CheckpointManager(s3_url, "trainer_0", "npz")
    exists = single.check_db_exists(2)
    LocalSession().run(exists)
    assert exists.outputs()[0].fetch() is True


def test_cp_accessible_heads_the_bucket(s3_url: str, s3_faults: FaultProxy) -> None:
    storage = S3Path(s3_url)
    assert storage.accessible()
    missing = S3Path(s3_url.replace("s3://", "s3://no-such-bucket-").split("/ckpt")[0], retries=0)
    assert not missing.accessible()
    assert {r.method for r in s3_faults.requests} == {"HEAD"}
    assert s3_faults.listings() == []


def _put_blob(ws: Workspace) -> None:
    ws["x"] = np.arange(5)


def test_a_fresh_bucket_per_test(s3_url: str) -> None:
    storage = S3Path(s3_url)
    assert storage.list_keys() == []
    session = LocalSession()
    with Node("trainer_0"):
        task = Task(_put_blob)
    session.run(task)
    manager = CheckpointManager(s3_url, "trainer_0", "npz")
    with Node("trainer_0"):
        session.run(manager.init(["trainer_0"]))
    session.run(manager.save(0))
    assert "trainer_0.0/ckptstore.manifest.json" in storage.list_keys()
