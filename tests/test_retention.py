"""Retention: which epochs are kept, what is deleted, and what is never touched."""

from __future__ import annotations

import logging
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from ckpt_helpers import data_key

from ckptstore import protocol
from ckptstore.checkpoint._multinode import MultiNodeCheckpointManager
from ckptstore.checkpoint._retention import (
    TOMBSTONE_KIND,
    KeepLast,
    carry_out,
    enforce,
    plan_retention,
    tombstone_key,
)
from ckptstore.checkpoint._runner import JobRunner
from ckptstore.errors import JobConfigurationError
from ckptstore.execution._session import LocalSession
from ckptstore.formats._npz_db import NpzDB
from ckptstore.formats._zarr_db import ZarrDB
from ckptstore.io._engine import ParallelIO
from ckptstore.paths._local_path import LocalPath
from ckptstore.protocol._inventory import committed_epochs
from ckptstore.records._documents import encode_document
from ckptstore.testing.conformance import NODES, counting_job, expected_state
from ckptstore.testing.conformance.samples import assert_same_blob


def save(
    storage: LocalPath, epoch: int, nodes: tuple[str, ...] = NODES, commit: bool = True
) -> None:
    commits = [
        protocol.write_node(storage, node, epoch, {"w": np.full(4, epoch)}, NpzDB(), ParallelIO())
        for node in nodes
    ]
    if commit:
        protocol.commit_epoch(storage, epoch, commits)


@pytest.fixture
def storage(tmp_path: Path) -> LocalPath:
    storage = LocalPath(str(tmp_path / "run"))
    for epoch in range(8):
        save(storage, epoch)
    return storage


@pytest.mark.parametrize(
    ("policy", "kept"),
    [
        (KeepLast(3), {5, 6, 7}),
        (KeepLast(1), {7}),
        (KeepLast(2, every=3), {0, 3, 6, 7}),
        (KeepLast(10), set(range(8))),
    ],
)
def test_keep_last_and_every(policy: KeepLast, kept: set[int]) -> None:
    assert policy.keep(list(range(8))) == kept


@pytest.mark.parametrize(("last", "every"), [(0, None), (2, 0)])
def test_nonsense_policies_are_refused(last: int, every: int | None) -> None:
    with pytest.raises(JobConfigurationError, match="at least 1"):
        KeepLast(last, every)


def test_dry_run_plans_without_deleting(storage: LocalPath) -> None:
    plan = enforce(storage, KeepLast(2), dry_run=True)
    assert [removal.epoch for removal in plan.delete] == [0, 1, 2, 3, 4, 5]
    assert plan.keep == (6, 7)
    records = [protocol.read_commit(storage, epoch) for epoch in range(6)]
    assert plan.freed_bytes == sum(
        node.stored_bytes for record in records if record for node in record.nodes.values()
    )
    assert committed_epochs(storage) == list(range(8))


def test_deletes_only_what_commit_records_own(storage: LocalPath, tmp_path: Path) -> None:
    save(storage, 9, commit=False)  # a save in progress: never committed
    save(storage, 3, nodes=("trainer_9",), commit=False)  # a node the record of 3 lacks
    storage.write_bytes(".trainer_0.10.staging-abc/blobs.npz", b"in flight")
    storage.write_bytes("notes/readme.txt", b"not ours")

    plan = enforce(storage, KeepLast(2))
    assert [removal.epoch for removal in plan.delete] == [0, 1, 2, 3, 4, 5]
    assert committed_epochs(storage) == [6, 7]
    left = sorted(path.name for path in (tmp_path / "run").iterdir())
    assert left == [
        ".trainer_0.10.staging-abc",
        "_ckptstore",
        "notes",
        "trainer_0.6",
        "trainer_0.7",
        "trainer_0.9",
        "trainer_1.6",
        "trainer_1.7",
        "trainer_1.9",
        "trainer_9.3",
    ]
    assert not any("deleting" in key for key in storage.list_keys("_ckptstore"))


def test_epochs_newer_than_upto_are_left_alone(storage: LocalPath) -> None:
    plan = enforce(storage, KeepLast(2), upto=4, protect={4})
    assert [removal.epoch for removal in plan.delete] == [0, 1, 2]
    assert committed_epochs(storage) == [3, 4, 5, 6, 7]


def crash_mid_deletion(storage: LocalPath, epoch: int) -> None:
    """What a deletion interrupted after its commit-record step leaves behind."""
    document = encode_document(TOMBSTONE_KIND, {"nodes": list(NODES)})
    storage.put_document(tombstone_key(epoch), document)
    protocol.retract_epoch(storage, epoch, NODES)


def test_an_interrupted_deletion_is_finished_next_time(storage: LocalPath) -> None:
    crash_mid_deletion(storage, 2)
    plan = plan_retention(storage, KeepLast(100))
    assert [(r.epoch, r.resumed) for r in plan.delete] == [(2, True)]
    enforce(storage, KeepLast(100))
    assert not storage.list_keys("trainer_0.2")  # every attempt deleted
    assert not storage.exists(tombstone_key(2))
    assert committed_epochs(storage) == [0, 1, 3, 4, 5, 6, 7]


def test_resuming_a_deletion_spares_an_epoch_committed_again(storage: LocalPath) -> None:
    crash_mid_deletion(storage, 5)
    save(storage, 5)  # the epoch was saved and committed again since
    enforce(storage, KeepLast(100))
    assert protocol.committed_nodes(storage, 5) == set(NODES)
    assert storage.exists(f"{data_key(storage, 'trainer_1', 5)}/ckptstore.manifest.json")


def test_the_runner_applies_retention_after_each_committed_save(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    manager = MultiNodeCheckpointManager(url, "npz", metadata_handler="json")
    runner = JobRunner(counting_job(epochs=6), manager, retention=KeepLast(2, every=4))
    assert runner.train(LocalSession()) == 6
    assert runner.committed_epochs == [0, 1, 2, 3, 4, 5, 6]
    assert committed_epochs(LocalPath(url)) == [0, 4, 5, 6]
    resumed = MultiNodeCheckpointManager(url, "npz", metadata_handler="json")
    resumed.set_params(list(NODES))
    assert resumed.get_resume_from_epoch_id(None) == 6
    assert sorted(resumed.metadata_handler.epochs()) == [0, 4, 5, 6]  # the catalog forgot too


def test_a_failing_deletion_never_fails_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(self: LocalPath, prefix: str) -> None:
        raise PermissionError("read-only")

    monkeypatch.setattr(LocalPath, "delete_tree", refuse)
    manager = MultiNodeCheckpointManager(str(tmp_path / "run"), "npz")
    runner = JobRunner(counting_job(epochs=2), manager, retention=KeepLast(1))
    with caplog.at_level(logging.WARNING, logger="ckptstore.checkpoint._retention"):
        assert runner.train(LocalSession()) == 2
    assert runner.committed_epochs == [0, 1, 2]
    assert "Retention after epoch 1 failed" in caplog.text


def test_retention_set_on_the_manager_is_applied_by_the_runner(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    manager = MultiNodeCheckpointManager(url, "npz", retention=KeepLast(2))
    assert JobRunner(counting_job(epochs=4), manager).train(LocalSession()) == 4
    assert committed_epochs(LocalPath(url)) == [3, 4]


def test_the_runners_retention_wins_over_the_managers(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    manager = MultiNodeCheckpointManager(url, "npz", retention=KeepLast(1))
    runner = JobRunner(counting_job(epochs=4), manager, retention=KeepLast(3))
    assert runner.train(LocalSession()) == 4
    assert committed_epochs(LocalPath(url)) == [2, 3, 4]


# -- ownership: a job's retention deletes only its own nodes ---------------------------


def run_job(url: str, node: str, epochs: int) -> tuple[JobRunner, LocalSession]:
    """One single-node job on the shared prefix, KeepLast(2), json catalog."""
    session = LocalSession()
    manager = MultiNodeCheckpointManager(url, "npz", metadata_handler="json")
    runner = JobRunner(counting_job((node,), epochs=epochs), manager, retention=KeepLast(2))
    runner.train(session)
    return runner, session


def test_two_jobs_sharing_a_prefix_keep_their_newest_epochs(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    storage = LocalPath(url)
    run_job(url, "trainer_0", 5)  # A: epochs 0..5, keeps 4 and 5
    run_job(url, "trainer_1", 7)  # B: epochs 0..7 on the same prefix, keeps 6 and 7
    assert {
        e for e in committed_epochs(storage) if "trainer_0" in protocol.committed_nodes(storage, e)
    } == {4, 5}
    assert {
        e for e in committed_epochs(storage) if "trainer_1" in protocol.committed_nodes(storage, e)
    } == {6, 7}
    for node, newest in (("trainer_0", 5), ("trainer_1", 7)):
        for epoch in (newest - 1, newest):
            manifest = protocol.open_node(storage, node, epoch)
            assert protocol.verify_node(storage, node, epoch, NpzDB(), ParallelIO()) == []
            assert manifest.node == node
    # both resume from their own newest epoch, with the state saved then
    for node, newest in (("trainer_0", 5), ("trainer_1", 7)):
        runner, session = run_job(url, node, newest + 1)  # the limit raised by one epoch
        assert runner.committed_epochs == [newest + 1]
        for name, blob in expected_state(node, newest + 1, (node,)).items():
            assert_same_blob(session.workspace(node)[name].copy(), blob)
    assert sorted(p.name for p in (tmp_path / "run").iterdir() if p.name != "_ckptstore") == [
        "trainer_0.5",
        "trainer_0.6",
        "trainer_1.7",
        "trainer_1.8",
    ]


def test_an_epochs_commit_record_goes_only_with_its_last_node(storage: LocalPath) -> None:
    plan = enforce(storage, KeepLast(2), nodes=["trainer_0"])
    assert [(r.epoch, r.nodes) for r in plan.delete] == [(e, ("trainer_0",)) for e in range(6)]
    assert committed_epochs(storage) == list(range(8))  # trainer_1 is still in every epoch
    assert all(protocol.committed_nodes(storage, e) == {"trainer_1"} for e in range(6))
    assert not storage.list_keys("trainer_0.0")  # every attempt deleted
    assert storage.exists(f"{data_key(storage, 'trainer_1', 0)}/ckptstore.manifest.json")
    enforce(storage, KeepLast(2), nodes=["trainer_1"])
    assert committed_epochs(storage) == [6, 7]  # now nobody's: the commit records went


def test_dry_run_with_nodes_plans_only_their_share(storage: LocalPath) -> None:
    plan = enforce(storage, KeepLast(7), nodes=["trainer_1"], dry_run=True)
    assert [(r.epoch, r.nodes) for r in plan.delete] == [(0, ("trainer_1",))]
    assert plan.freed_bytes == protocol.read_commit(storage, 0).nodes["trainer_1"].stored_bytes
    assert protocol.committed_nodes(storage, 0) == set(NODES)


def test_retention_lists_the_control_directory_once(
    storage: LocalPath, monkeypatch: pytest.MonkeyPatch
) -> None:
    listed: list[str] = []
    original, original_except = LocalPath.list_keys, LocalPath.list_keys_except

    def counting(self: LocalPath, prefix: str = "") -> list[str]:
        listed.append(prefix)
        return original(self, prefix)

    def counting_except(self: LocalPath, prefix: str, skip: str) -> list[str]:
        listed.append(f"{prefix} but {skip}")
        return original_except(self, prefix, skip)

    monkeypatch.setattr(LocalPath, "list_keys", counting)
    monkeypatch.setattr(LocalPath, "list_keys_except", counting_except)
    enforce(storage, KeepLast(2), upto=7, protect={7}, nodes=list(NODES))
    assert listed == ["_ckptstore but _ckptstore/chunks"]  # never the chunk store


RETENTION_CHILD = Path(__file__).with_name("retention_crash_child.py")


def run_retention_child(directory: Path, node: str, kill_at: int) -> str:
    result = subprocess.run(
        [sys.executable, str(RETENTION_CHILD), str(directory), node, str(kill_at)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode in (0, -signal.SIGKILL), result.stderr
    assert (result.returncode == 0) == (kill_at == 0)
    return result.stdout


def assert_every_committed_node_loads(storage: LocalPath) -> None:
    for epoch in committed_epochs(storage):
        for node in protocol.committed_nodes(storage, epoch):
            protocol.open_node(storage, node, epoch)
            assert protocol.verify_node(storage, node, epoch, NpzDB(), ParallelIO()) == []


def test_sigkill_mid_retention_never_leaves_a_committed_unloadable_epoch(
    storage: LocalPath, tmp_path: Path
) -> None:
    template = Path(storage.root)
    shutil.copytree(template, tmp_path / "count")
    total = int(run_retention_child(tmp_path / "count", "trainer_0", 0).split("=")[1])
    assert total > 20
    # every step of the first epoch's removal, then points spread over the rest
    for kill_at in sorted({*range(1, 9), *range(9, total + 1, max(1, total // 12))}):
        crashed = tmp_path / f"crashed-{kill_at}"
        shutil.copytree(template, crashed)
        run_retention_child(crashed, "trainer_0", kill_at)
        crashed_storage = LocalPath(str(crashed))
        assert_every_committed_node_loads(crashed_storage)
        # trainer_1 never lost anything; the next pass finishes trainer_0's deletion
        assert all("trainer_1" in protocol.committed_nodes(crashed_storage, e) for e in range(8))
        enforce(crashed_storage, KeepLast(1), nodes=["trainer_0"])
        assert_every_committed_node_loads(crashed_storage)
        owned = [e for e in range(8) if "trainer_0" in protocol.committed_nodes(crashed_storage, e)]
        assert owned == [7]
        assert sorted(p.name for p in crashed.glob("trainer_0.*")) == ["trainer_0.7"]
        # (a document write killed before its rename may leave a hidden temporary file)
        left = [k for k in crashed_storage.list_keys("_ckptstore") if k.endswith("json")]
        assert not [k for k in left if "deleting" in k]


def test_deleting_a_node_reports_its_bytes_as_its_files_go(tmp_path: Path) -> None:
    """``gc --progress`` moves inside a node: a node of many files (zarr with zstd, a file
    per chunk and document) reports in several steps, adding up to its stored bytes, and
    its neighbour epoch ``trainer_0.10`` (a name starting like ``trainer_0.1``) is kept."""
    storage = LocalPath(str(tmp_path / "run"))
    blobs = {f"w{i}": np.full(1024, i, dtype=np.float32) for i in range(40)}
    for epoch in (1, 10):
        commit = protocol.write_node(
            storage, "trainer_0", epoch, blobs, ZarrDB(compression="zstd"), ParallelIO()
        )
        protocol.commit_epoch(storage, epoch, [commit])
    plan = plan_retention(storage, KeepLast(1))
    assert [removal.epoch for removal in plan.delete] == [1]
    heard: list[int] = []
    carry_out(storage, plan, on_bytes=heard.append)
    assert len(heard) >= 10  # a step per group of files, not one for the node
    assert sum(heard) == plan.freed_bytes
    assert committed_epochs(storage) == [10]
    assert not storage.list_keys("trainer_0.1")
    assert len(storage.list_keys("trainer_0.10")) > 40
