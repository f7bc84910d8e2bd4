"""Several roots, fastest first: local disk then S3 (moto) or GCS (the emulator)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ckpt_helpers import build_counter_job, flip_byte

from ckptstore import Job, JobRunner, LocalSession, Node, Task, epoch_limiter
from ckptstore.builtin import CopyUpload
from ckptstore.checkpoint import CheckpointManager, KeepLast, MultiNodeCheckpointManager
from ckptstore.errors import JobConfigurationError, TierConflictError, TierCopyFailedError
from ckptstore.protocol import CheckpointLocation, CommitListing, committed_nodes, read_commit
from ckptstore.testing import FaultProxy
from ckptstore.tree import load_tree, save_tree

NODES = ("trainer_0", "trainer_1")
CHILD = Path(__file__).parents[1] / "tier_copy_child.py"


class Reports:
    """A metadata handler that records what it is told."""

    def __init__(self) -> None:
        self.actions: list[tuple[str, list[Any]]] = []

    def set_params(self, **kwargs: Any) -> None: ...
    def write(self, epoch: int) -> None: ...
    def last_epoch(self, user_epoch: int | None = None) -> int | None:
        return user_epoch

    def cp_accessible(self, epoch: int | None = None) -> bool:
        return True

    def report(self, action: str, stats: Any) -> None:
        self.actions.append((action, list(stats.values())))


def _train(roots: list[Any], epochs: int, **options: Any) -> tuple[JobRunner, LocalSession]:
    job, _ = build_counter_job(NODES, epochs=epochs)
    manager = MultiNodeCheckpointManager(roots, "zarr", "json", retention=options.pop("keep", None))
    assert manager.tiers is not None
    manager.tiers.copy_every_epoch = options.pop("every_epoch", False)
    runner = JobRunner(job, manager, **options)
    session = LocalSession()
    runner.train(session)
    return runner, session


def _complete(url: str, storage_options: dict[str, Any] | None = None) -> list[int]:
    manager = CheckpointManager(url, "trainer_0", storage_options=storage_options)
    return CommitListing.of(manager.location.storage).complete(NODES)


@pytest.mark.parametrize("async_save", [False, True])
def test_every_root_holds_the_last_epoch_as_an_ordinary_root(
    tmp_path: Path, s3_url: str, async_save: bool
) -> None:
    local = str(tmp_path / "fast")
    _train(
        [local, s3_url], 4, keep=[KeepLast(2), KeepLast(4)], async_save=async_save, every_epoch=True
    )
    assert _complete(local) == [3, 4]  # per-root retention
    assert _complete(s3_url) == [1, 2, 3, 4]
    # a plain one-root manager reads the S3 copy alone, verified
    alone = MultiNodeCheckpointManager(s3_url, "zarr")
    session = LocalSession()
    session.run(alone.init(list(NODES), retrieve_from_epoch=4))
    assert alone.verify(4) == []
    session.run(alone.load(4))
    assert session.fetch_blob("trainer_1", "trainer_1/step") == 4


def test_a_resume_after_the_fast_root_was_deleted_reads_the_durable_one(
    tmp_path: Path, s3_url: str
) -> None:
    local = tmp_path / "fast"
    _train([str(local), s3_url], 3)
    for path in sorted(local.rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    local.rmdir()
    runner, session = _train([str(local), s3_url], 5)
    assert runner.resumed_from_epoch == 3
    assert session.fetch_blob("trainer_0", "trainer_0/w").tolist() == [5.0] * 4
    assert _complete(str(local)) == [4, 5]
    assert _complete(s3_url)[-1] == 5


def test_a_damaged_node_on_the_fast_root_is_read_from_the_slower_one(
    tmp_path: Path, s3_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    local = tmp_path / "fast"
    _train([str(local), s3_url], 3)
    data = next(
        p for p in (local / "trainer_1.3").rglob("*") if p.is_file() and "manifest" not in p.name
    )
    for offset in range(data.stat().st_size):  # every byte damaged
        flip_byte(data, offset)
    runner, session = _train([str(local), s3_url], 4)
    assert runner.resumed_from_epoch == 3  # the same epoch, not a fallback to an older one
    assert runner.restore_failures == []
    assert session.fetch_blob("trainer_1", "trainer_1/w").tolist() == [4.0] * 4
    assert any("trainer_1 of epoch 3 cannot be read from" in r.message for r in caplog.records)


def test_an_s3_outage_delays_copies_never_saves(
    tmp_path: Path, s3_url: str, s3_faults: FaultProxy
) -> None:
    handler = Reports()
    durable = CheckpointLocation.open(s3_url, "zarr", storage_options={"retries": 0})
    manager = CheckpointManager([str(tmp_path / "fast"), durable], "trainer_0", "zarr", handler)
    assert manager.tiers is not None
    manager.tiers.retries, manager.tiers.backoff = 1, 0.01
    lag: dict[str, int | None] = {}

    def weather(ws: Any) -> None:
        epoch = int(ws["step"]) + 1  # the epoch this task trains
        if epoch == 2:  # epochs 0 and 1 are on S3: cut it off
            manager.tiers.wait()  # type: ignore[union-attr]
            s3_faults.outage()
        if epoch == 4:  # epochs 2 and 3 could not be copied: S3 comes back
            manager.tiers.wait()  # type: ignore[union-attr]
            lag.update(manager.tiers.lag())  # type: ignore[union-attr]
            s3_faults.restore()
        ws["step"] += 1

    with Job() as job, Node("trainer_0"):
        with job.init_group:
            Task(lambda ws: ws.update(step=np.array(0)))
        Task(weather)
        epoch_limiter(job, 5)
    runner = JobRunner(job, manager)
    assert runner.train(LocalSession()) == 5
    assert runner.committed_epochs == [0, 1, 2, 3, 4, 5]  # saves went on locally
    assert lag == {s3_url: 2}  # before epoch 4's save: 3 on the first root, 1 on S3
    failed = [(f.epoch, type(f.error)) for f in runner.save_failures]
    assert failed == [(2, TierCopyFailedError), (3, TierCopyFailedError)]
    assert s3_url in str(runner.save_failures[0].error)
    reported = [
        stats[0].epoch for action, stats in handler.actions if action == "checkpoint_copy_failed"
    ]
    assert reported == [2, 3]
    storage = manager.tiers.read_locations()[1].storage
    assert CommitListing.of(storage).complete(["trainer_0"]) == [0, 1, 4, 5]  # caught up


def test_train_raises_naming_the_root_that_lacks_the_last_epoch(
    tmp_path: Path, s3_url: str, s3_faults: FaultProxy
) -> None:
    job, _ = build_counter_job(["trainer_0"], epochs=1)
    durable = CheckpointLocation.open(s3_url, "zarr", storage_options={"retries": 0})
    manager = CheckpointManager([str(tmp_path / "fast"), durable], "trainer_0", "zarr")
    assert manager.tiers is not None
    manager.tiers.retries, manager.tiers.backoff = 0, 0.01
    s3_faults.outage()
    with pytest.raises(TierCopyFailedError, match="epoch 1 was not copied to s3://"):
        JobRunner(job, manager).train(LocalSession())
    first = CommitListing.of(manager.location.storage)
    assert first.complete(["trainer_0"]) == [0, 1]  # committed on the first root all the same


WRITES = {"PUT", "POST", "DELETE"}
LONG = os.environ.get("CKPTSTORE_LONG_TESTS") == "1"


def test_a_copy_killed_midway_is_never_visible_and_the_next_run_redoes_it(
    tmp_path: Path, s3_url: str, s3_faults: FaultProxy
) -> None:
    _kill_during_copy(tmp_path, s3_url, s3_faults, "trainer_0.3/*/ckptstore.manifest", 0)


def test_a_copy_killed_at_any_of_its_writes_is_never_visible(
    tmp_path: Path, s3_url: str, s3_faults: FaultProxy
) -> None:
    subprocess.run([sys.executable, str(CHILD), str(tmp_path / "dry"), s3_url, "3"], check=True)
    writes = [r for r in s3_faults.requests if r.method in WRITES and "trainer_0.3/" in r.path]
    assert len(writes) >= 2  # the archive, the manifest (and the delete before it)
    points = [("trainer_0.3/", k) for k in range(len(writes))] + [("epoch-3/", 0)]
    if not LONG:  # the last data write and the commit record; every point takes ~1 min
        points = points[-2:]
    for index, (path, after) in enumerate(points):
        run = tmp_path / f"point{index}"
        _kill_during_copy(run, f"{s3_url}{index}", s3_faults, path, after)


def _kill_during_copy(
    tmp_path: Path, s3_url: str, proxy: FaultProxy, path: str, after: int
) -> None:
    """Kill -9 the child while the proxy holds the ``after``-th write to ``path`` of
    epoch 3's copy; then S3 must show no trace of it, and a rerun must copy it."""
    local = str(tmp_path / "fast")
    proxy.stall_next(seconds=120, methods=WRITES, path=path, after=after)
    child = subprocess.Popen([sys.executable, str(CHILD), local, s3_url, "3"])
    try:
        _wait_for(lambda: proxy.holding, child)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    finally:
        proxy.restore()
        proxy.release()
    s3 = CheckpointManager(s3_url, "trainer_0").location.storage
    # held at its commit record, the copy is complete: that PUT, sent whole before the
    # kill, lands when the proxy lets it go, and epoch 3 is committed (and intact)
    if not path.startswith("epoch-"):
        assert committed_nodes(s3, 3, ["trainer_0"]) == set()  # half copied: not visible
    before = CommitListing.of(s3).complete(["trainer_0"])  # every committed epoch intact
    assert all(CheckpointManager(s3_url, "trainer_0").verify(e) == [] for e in before)
    job, _ = build_counter_job(["trainer_0"], epochs=3)
    manager = CheckpointManager([local, s3_url], "trainer_0", "zarr", "json")
    JobRunner(job, manager).train(LocalSession())  # finished: only the copy is redone
    assert committed_nodes(s3, 3, ["trainer_0"]) == {"trainer_0"}
    assert CheckpointManager(s3_url, "trainer_0").verify(3) == []


def test_save_tree_to_local_disk_then_gcs(tmp_path: Path, gcs_url: str) -> None:
    roots = [str(tmp_path / "fast"), gcs_url]
    save_tree(roots, 1, {"w": np.arange(3.0)})
    assert load_tree(gcs_url)["w"].tolist() == [0.0, 1.0, 2.0]  # type: ignore[index]
    assert load_tree(roots)["w"].tolist() == [0.0, 1.0, 2.0]  # type: ignore[index]


def test_an_upload_builder_serves_as_a_tier(tmp_path: Path) -> None:
    archive = CopyUpload(str(tmp_path / "archive"))
    save_tree([str(tmp_path / "fast"), archive], 2, {"w": np.ones(2)})
    assert committed_nodes(archive.storage, 2, ["tree"]) == {"tree"}


def _wait_for(condition: Callable[[], object], child: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while not condition():
        assert child.poll() is None, "the child ended before its copy started"
        assert time.monotonic() < deadline, "the copy never started"
        time.sleep(0.05)


class GatedCopy(CopyUpload):
    """The built-in copy, whose first copy waits for ``gate``."""

    def __init__(self, dest: str, gate: threading.Event) -> None:
        super().__init__(dest)
        self.gate = gate

    def build(self, epoch: int, checkpoint_manager: Any) -> Any:
        assert self.gate.wait(60)
        return super().build(epoch, checkpoint_manager)


def test_epochs_queued_behind_a_slow_copy_give_way_to_the_newest(tmp_path: Path) -> None:
    gate = threading.Event()
    durable = GatedCopy(str(tmp_path / "durable"), gate)
    manager = CheckpointManager([str(tmp_path / "fast"), durable], "trainer_0", "npz")
    assert manager.tiers is not None
    session = LocalSession()
    session.workspace("trainer_0")["w"] = np.ones(2)
    session.run(manager.init(["trainer_0"]))
    for epoch in range(4):  # epoch 0's copy waits at the gate; 1-3 queue up behind it
        session.run(manager.save(epoch))
    assert manager.tiers.in_transit() == {0, 1, 2, 3}  # the first root's retention keeps them
    gate.set()
    manager.tiers.wait()
    assert CommitListing.of(durable.storage).complete(["trainer_0"]) == [0, 3]
    assert manager.tiers.in_transit() == set()


def test_a_job_starts_and_resumes_locally_while_s3_is_down(
    tmp_path: Path, s3_url: str, s3_faults: FaultProxy
) -> None:
    local = str(tmp_path / "fast")
    durable = CheckpointLocation.open(s3_url, "zarr", storage_options={"retries": 0})
    job, _ = build_counter_job(["trainer_0"], epochs=2)
    JobRunner(job, CheckpointManager([local, durable], "trainer_0", "zarr", "json")).train(
        LocalSession()
    )
    s3_faults.outage()
    job, _ = build_counter_job(["trainer_0"], epochs=3)
    manager = CheckpointManager([local, durable], "trainer_0", "zarr", "json")
    assert manager.tiers is not None
    manager.tiers.retries = 0
    runner = JobRunner(job, manager)
    with pytest.raises(TierCopyFailedError, match="epoch 3 was not copied"):
        runner.train(LocalSession())
    assert runner.resumed_from_epoch == 2  # from the local root, S3 unreachable
    assert runner.committed_epochs == [3]


def test_roots_and_policies_that_do_not_fit_are_refused(tmp_path: Path) -> None:
    roots = [str(tmp_path / "fast"), str(tmp_path / "durable")]
    with pytest.raises(JobConfigurationError, match="2 roots"):
        CheckpointManager(roots, "trainer_0", retention=[KeepLast(1)] * 3)
    with pytest.raises(JobConfigurationError, match="the first root is where saves commit"):
        CheckpointManager([CopyUpload(roots[0]), roots[1]], "trainer_0")
    with pytest.raises(JobConfigurationError, match="at least one"):
        MultiNodeCheckpointManager([], "zarr")
    one_policy = CheckpointManager(roots, "trainer_0", retention=KeepLast(2))
    assert one_policy.retention == KeepLast(2)  # a single policy applies to every root
    assert one_policy.tiers is not None
    assert one_policy.tiers.roots == roots


def _saving(fast: Path, durable: Path, value: float, keep: Any = None) -> tuple[Any, LocalSession]:
    manager = CheckpointManager(
        [str(fast), str(durable)], "trainer_0", "npz", retention=[None, keep]
    )
    assert manager.tiers is not None
    manager.tiers.retries, manager.tiers.backoff = 1, 0.0
    session = LocalSession()
    session.workspace("trainer_0")["w"] = np.full(2, value)
    session.run(manager.init(["trainer_0"]))
    return manager, session


def test_copies_in_a_child_process_at_low_priority_survive_its_kill(tmp_path: Path) -> None:
    manager, session = _saving(tmp_path / "fast", tmp_path / "durable", 1.0)
    tiers = manager.tiers
    tiers.copy_in_process, tiers.copy_niceness = True, 5
    session.run(manager.save(1))
    tiers.wait()
    (child,) = tiers._pool._processes  # type: ignore[union-attr]
    assert os.getpriority(os.PRIO_PROCESS, child) >= os.getpriority(os.PRIO_PROCESS, 0) + 5
    os.kill(child, signal.SIGKILL)  # the next copy's first attempt finds its process gone
    session.run(manager.save(2))
    tiers.wait()
    assert tiers.take_failures() == []  # retried in a new child process
    assert tiers.holding(2, ["trainer_0"]) == [str(tmp_path / "fast"), str(tmp_path / "durable")]
    assert CommitListing.of(tiers.read_locations()[1].storage).complete(["trainer_0"]) == [1, 2]


def test_a_second_job_on_the_same_later_root_never_replaces_or_deletes_its_epochs(
    tmp_path: Path,
) -> None:
    durable = tmp_path / "durable"
    first, session = _saving(tmp_path / "a", durable, 1.0)
    session.run(first.save(1))
    first.tiers.wait()
    theirs = read_commit(first.tiers.read_locations()[1].storage, 1, ["trainer_0"])
    second, session = _saving(tmp_path / "b", durable, 2.0, keep=KeepLast(1))
    session.run(second.save(1))  # committed on b; the copy finds the first job's epoch 1
    second.tiers.wait()
    (failure,) = second.tiers.take_failures()  # given up at once, not retried
    assert isinstance(failure.error, TierConflictError)
    assert failure.epoch == 1
    assert "another job writes to this root" in str(failure.error)
    with pytest.raises(TierCopyFailedError, match="durable") as raised:  # what train() raises
        second.tiers.ensure(1, ["trainer_0"])
    assert isinstance(raised.value.__cause__, TierConflictError)
    session.run(second.save(2))  # copied; the shared root's retention (KeepLast(1)) stays off
    second.tiers.wait()
    storage = second.tiers.read_locations()[1].storage
    assert CommitListing.of(storage).complete(["trainer_0"]) == [1, 2]
    assert read_commit(storage, 1, ["trainer_0"]) == theirs  # the first job's, untouched


def _process_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _pausing_copy(tmp_path: Path) -> tuple[Any, LocalSession, int, list[str]]:
    """A manager whose copies run in a child process paused during saves, epoch 1 copied,
    and the child's state (``T``: stopped) noted at each :meth:`Tiers.resume` call."""
    manager, session = _saving(tmp_path / "fast", tmp_path / "durable", 1.0)
    tiers = manager.tiers
    tiers.copy_in_process = tiers.pause_during_saves = True
    session.run(manager.save(1))
    tiers.wait()
    child = tiers._child
    assert child is not None
    seen: list[str] = []
    resume = tiers.resume

    def seen_then_resume() -> None:
        seen.append(_process_state(child))
        resume()

    tiers.resume = seen_then_resume  # type: ignore[method-assign]
    return manager, session, child, seen


def test_a_save_stops_the_copy_process_until_it_committed(tmp_path: Path) -> None:
    manager, session, child, seen = _pausing_copy(tmp_path)
    tiers = manager.tiers
    session.run(manager.save(2))
    assert seen == ["T"]  # stopped while the save ran
    assert _process_state(child) != "T"
    tiers.wait()
    assert tiers.holding(2, ["trainer_0"]) == [str(tmp_path / "fast"), str(tmp_path / "durable")]


def test_an_async_save_stops_the_copy_process_only_while_it_copies_the_state(
    tmp_path: Path,
) -> None:
    manager, session, child, seen = _pausing_copy(tmp_path)
    tiers = manager.tiers
    manager.save_async(2, session)  # returns once the state is staged
    assert _process_state(child) != "T"  # going on while the write runs
    # waits for epoch 2's commit first (one save in flight): the copy stays stopped
    manager.save_async(3, session).result(timeout=60)

    assert seen == ["T", "T"]  # only the snapshots ended the pauses, each while stopped
    tiers.wait()
    assert tiers.holding(3, ["trainer_0"]) == [str(tmp_path / "fast"), str(tmp_path / "durable")]


_KILLED_JOB = """
import os, signal, sys
import numpy as np
from ckptstore import CheckpointManager, LocalSession
manager = CheckpointManager([sys.argv[1], sys.argv[2]], "trainer_0", "npz")
manager.tiers.copy_in_process = True
session = LocalSession()
session.workspace("trainer_0")["w"] = np.ones(2)
session.run(manager.init(["trainer_0"]))
session.run(manager.save(1))
manager.tiers.wait()
(child,) = manager.tiers._pool._processes
os.kill(child, signal.SIGSTOP)  # as pause_during_saves leaves it while a save runs
print(child, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _ends_within(pid: int, seconds: float) -> bool:
    """Whether process ``pid`` (not a child of this one) ends within ``seconds``: a
    pidfd becomes readable when its process ends."""
    try:
        handle = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        readable, _, _ = select.select([handle], [], [], seconds)
        return bool(readable)
    finally:
        os.close(handle)


def test_a_stopped_copy_child_dies_with_its_killed_job(tmp_path: Path) -> None:
    """A job killed (SIGKILL) while its copy's child process is stopped leaves no
    process behind: the child dies with it (``PR_SET_PDEATHSIG``)."""
    printed, errors = tmp_path / "child.pid", tmp_path / "stderr"  # files, not pipes
    with printed.open("w") as out, errors.open("w") as err:  # the child would hold open
        job = subprocess.run(
            [sys.executable, "-c", _KILLED_JOB, str(tmp_path / "fast"), str(tmp_path / "durable")],
            stdout=out,
            stderr=err,
            timeout=120,
        )
    assert job.returncode == -signal.SIGKILL, errors.read_text()
    child = int(printed.read_text().split()[-1])
    if not _ends_within(child, 30):
        os.kill(child, signal.SIGKILL)
        pytest.fail(f"the copy's child {child} outlived its job")
