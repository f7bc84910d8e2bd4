"""Two-tier saves: a job checkpoints to fast local disk every epoch and ``CopyUpload``
copies its final committed epoch to S3, verified by checksum, the remote commit record
written last. A restore can come from either tier."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from ckptstore_s3 import S3Path

from ckptstore import CopyUpload, JobRunner, LocalSession, MultiNodeCheckpointManager
from ckptstore import commit as protocol
from ckptstore.builtin.local_path import LocalPath
from ckptstore.plugin.registry import get_registry
from ckptstore.testing import FaultProxy
from ckptstore.testing.conformance import NODES, counting_job, expected_state, flip_byte

DB_TYPES = sorted(name for name, cls in get_registry().db_types.items() if not cls.needs_rename)


def assert_state(session: LocalSession, epoch: int) -> None:
    for node in NODES:
        for name, value in expected_state(node, epoch).items():
            assert np.array_equal(session.workspace(node)[name], value), (node, name)


@pytest.mark.parametrize("db_type", DB_TYPES)
def test_the_final_epoch_is_uploaded_and_restores_from_either_tier(
    tmp_path: Path, s3_url: str, s3_faults: FaultProxy, db_type: str
) -> None:
    local = str(tmp_path / "fast")
    manager = MultiNodeCheckpointManager(local, db_type, "json")
    runner = JobRunner(
        counting_job(epochs=3), manager, upload_task_group_builder=CopyUpload(s3_url)
    )
    assert runner.train(LocalSession()) == 3
    assert runner.committed_epochs == [0, 1, 2, 3]  # every epoch saved locally

    remote = S3Path(s3_url)
    assert protocol.committed_nodes(remote, 3) == set(NODES)
    assert protocol.read_commit(remote, 2) is None  # only the final epoch is uploaded
    local_record = protocol.read_commit(LocalPath(local), 3)
    remote_record = protocol.read_commit(remote, 3)
    assert local_record is not None
    assert remote_record is not None
    for node in NODES:  # the very same manifests, byte for byte
        assert remote_record.nodes[node].manifest_crc32c == local_record.nodes[node].manifest_crc32c

    puts = [r.path for r in s3_faults.requests if r.method == "PUT"]
    assert puts[-1].endswith("/_ckptstore/epoch-3.commit.json")  # written last
    assert sum(path.endswith("epoch-3.commit.json") for path in puts) == 1
    assert s3_faults.listings() == []

    from_local = LocalSession()
    from_local.run(manager.load(3))
    assert_state(from_local, 3)
    shutil.rmtree(local)  # the fast tier is gone: the object store still has it
    from_remote = LocalSession()
    from_remote.run(manager.load(3, path_prefix=s3_url))
    assert_state(from_remote, 3)


def test_an_upload_through_throttling_and_resets_completes(
    tmp_path: Path, s3_url: str, s3_faults: FaultProxy
) -> None:
    upload = CopyUpload(s3_url, storage_options={"retry_base_delay": 0.01})
    manager = MultiNodeCheckpointManager(str(tmp_path), "npz")
    s3_faults.fail_next(3, status=503, methods={"PUT"})
    s3_faults.reset_next(2, methods={"GET", "HEAD"})
    JobRunner(counting_job(epochs=2), manager, upload_task_group_builder=upload).train(
        LocalSession()
    )
    assert protocol.committed_nodes(S3Path(s3_url), 2) == set(NODES)
    assert s3_faults.count(outcome="failed") == 3


def test_a_corrupt_local_checkpoint_is_not_uploaded(tmp_path: Path, s3_url: str) -> None:
    local = str(tmp_path / "fast")
    manager = MultiNodeCheckpointManager(local, "npz")
    JobRunner(counting_job(epochs=2), manager).train(LocalSession())
    flip_byte(LocalPath(local), "trainer_1.2/blobs.npz", 200)
    session = LocalSession()
    with pytest.raises(ValueError, match="CRC-32C"):
        session.run(CopyUpload(s3_url).build(2, manager))
    assert protocol.read_commit(S3Path(s3_url), 2) is None
