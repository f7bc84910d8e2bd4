"""Jobs checkpoint to ``gs://`` URLs with every object-store DB type and resume without
listing the bucket; large blobs go up as parallel composite uploads; the final epoch
uploads from local disk. All over real HTTP to a GCS emulator."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ckptstore_gcs import GCSPath

from ckptstore import (
    CheckpointManager,
    CopyUpload,
    JobRunner,
    LocalSession,
    MultiNodeCheckpointManager,
    Node,
)
from ckptstore import commit as protocol
from ckptstore.plugin.registry import get_registry
from ckptstore.testing import FaultProxy, GcsEmulator
from ckptstore.testing.conformance import NODES, counting_job, expected_state

DB_TYPES = sorted(name for name, cls in get_registry().db_types.items() if not cls.needs_rename)


def assert_state(session: LocalSession, epoch: int) -> None:
    for node in NODES:
        for name, value in expected_state(node, epoch).items():
            assert np.array_equal(session.workspace(node)[name], value), (node, name)


@pytest.mark.parametrize("db_type", DB_TYPES)
def test_a_job_saves_every_epoch_and_resumes_without_listing(
    gcs_url: str, gcs_faults: FaultProxy, db_type: str
) -> None:
    runner = JobRunner(counting_job(epochs=2), MultiNodeCheckpointManager(gcs_url, db_type, "json"))
    assert runner.train(LocalSession()) == 2
    assert runner.committed_epochs == [0, 1, 2]
    session = LocalSession()
    resumed = JobRunner(
        counting_job(epochs=2), MultiNodeCheckpointManager(gcs_url, db_type, "json")
    )
    assert resumed.train(session) == 3
    assert_state(session, 3)
    assert gcs_faults.listings() == []


def test_large_blobs_go_up_as_composite_uploads(gcs_url: str, gcs_faults: FaultProxy) -> None:
    weights = np.random.default_rng(2).standard_normal(1 << 20).astype(np.float32)  # 4 MiB
    session = LocalSession()
    session.workspace("trainer_0")["w"] = weights
    manager = CheckpointManager(gcs_url, "trainer_0", "npz", storage_options={"part_size": 1 << 20})
    with Node("trainer_0"):
        session.run(manager.init(["trainer_0"]))
    session.run(manager.save(1))
    composes = [r for r in gcs_faults.requests if r.path.endswith("/compose")]
    assert len(composes) == 1
    storage = manager.location.storage
    assert isinstance(storage, GCSPath)
    assert not [key for key in storage.list_keys() if "ckptstore-part" in key]  # cleaned up
    session.workspace("trainer_0")["w"] = np.zeros(1, dtype=np.float32)
    session.run(manager.load(1))
    assert np.array_equal(session.workspace("trainer_0")["w"], weights)


def test_settings_from_storage_options_alone(
    gcs_url: str, gcs_storage_options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("STORAGE_EMULATOR_HOST")
    manager = MultiNodeCheckpointManager(gcs_url, "npz", storage_options=gcs_storage_options)
    JobRunner(counting_job(epochs=1), manager).train(LocalSession())
    session = LocalSession()
    session.run(manager.load(1))
    assert_state(session, 1)


def test_two_tier_upload_restores_from_either_tier(
    tmp_path: Path, gcs_url: str, gcs_faults: FaultProxy
) -> None:
    manager = MultiNodeCheckpointManager(str(tmp_path), "npz")
    runner = JobRunner(
        counting_job(epochs=2), manager, upload_task_group_builder=CopyUpload(gcs_url)
    )
    runner.train(LocalSession())
    assert protocol.committed_nodes(GCSPath(gcs_url), 2) == set(NODES)
    uploads = [r for r in gcs_faults.requests if r.method == "POST" and "upload" in r.path]
    assert "epoch-2.commit.json" in uploads[-1].query  # the commit record last
    session = LocalSession()
    session.run(manager.load(2, path_prefix=gcs_url))
    assert_state(session, 2)


def test_accessible_reads_bucket_metadata_only(gcs_url: str, gcs_faults: FaultProxy) -> None:
    assert GCSPath(gcs_url).accessible()
    assert not GCSPath("gs://no-such-bucket-here/x", retries=0).accessible()
    assert {r.method for r in gcs_faults.requests} == {"GET"}
    assert gcs_faults.listings() == []


def test_a_second_emulator_can_run_beside_the_session_one(gcs_server: GcsEmulator) -> None:
    with GcsEmulator() as other:
        assert other.port != gcs_server.port
        other.create_bucket("side")
        storage = GCSPath("gs://side/x", endpoint_url=other.endpoint_url)
        storage.write_bytes("k", b"v")
        assert other.object_keys("side") == ["x/k"]
