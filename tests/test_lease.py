"""Writer leases: held, renewed by a heartbeat, released; a gone holder (expired by its
own timestamps, dead or zombie process on this host, unreadable lease) is taken over
with a warning, a live one is a LeaseHeldError; a job that lost its lease stops with
LeaseLostError and commits nothing more."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from ckptstore import (
    Job,
    JobRunner,
    LocalSession,
    MultiNodeCheckpointManager,
    Node,
    Task,
    epoch_limiter,
)
from ckptstore.builtin import LocalPath, NpzDB
from ckptstore.errors import (
    AlreadyCommittedError,
    JobConfigurationError,
    LeaseHeldError,
    LeaseLostError,
    StorageError,
)
from ckptstore.io import ParallelIO
from ckptstore.plugin import PathType
from ckptstore.protocol import (
    CommitListing,
    LeaseHolder,
    WriterLease,
    break_lease,
    commit_epoch,
    committed_nodes,
    read_commit,
    read_lease,
    read_lease_document,
    write_node,
)
from ckptstore.records._layout import lease_key

NODE = "trainer_0"
HOLDER = """
import sys, time
from ckptstore import LocalPath
from ckptstore.protocol import WriterLease
WriterLease(LocalPath(sys.argv[1]), ["trainer_0"], ttl=600).acquire()
print("holding", flush=True)
time.sleep(600)
"""


def put_holder(storage: PathType, **changes: object) -> LeaseHolder:
    values: dict[str, object] = {
        "node": NODE,
        "token": "other",
        "host": "elsewhere",
        "pid": 1,
        "started_at": 1000.0,
        "expires_at": 4e9,
        "generation": 3,
    }
    values.update(changes)
    holder = LeaseHolder(**values)  # type: ignore[arg-type]
    storage.put_document(lease_key(NODE), holder.encode())
    return holder


@pytest.fixture(params=["local", "s3", "gcs"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[PathType]:
    """A root on local disk, the moto S3 server and the GCS emulator: the lease's
    conditional writes against each store's own precondition."""
    if request.param == "local":
        yield LocalPath(str(tmp_path))
        return
    from ckptstore.plugin import get_registry

    url = str(request.getfixturevalue(f"{request.param}_url"))
    opened = get_registry().open_path(url)
    yield opened
    opened.close()


def test_a_lease_is_held_renewed_and_released(storage: PathType) -> None:
    now = [100.0]
    lease = WriterLease(storage, [NODE], ttl=60, heartbeat=False, clock=lambda: now[0])
    lease.acquire()
    holder = read_lease(storage, NODE)
    assert holder is not None
    assert (holder.token, holder.pid, holder.expires_at) == (lease.token, os.getpid(), 160.0)
    assert holder.generation == 1
    now[0] = 150.0
    lease.renew()
    assert read_lease(storage, NODE).expires_at == 210.0  # type: ignore[union-attr]
    lease.release()
    assert read_lease(storage, NODE) is None
    released = read_lease_document(storage, NODE)
    assert released is not None
    assert (released.state, released.generation) == ("released", 1)  # generations only grow
    with WriterLease(storage, [NODE], heartbeat=False) as again:
        assert again.generations == {NODE: 2}


def test_a_live_holder_elsewhere_is_named_in_the_error(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    put_holder(storage)
    with pytest.raises(LeaseHeldError, match=r"host elsewhere, pid 1, started 1970") as caught:
        WriterLease(storage, [NODE, "trainer_1"]).acquire()
    assert caught.value.node == NODE
    assert read_lease(storage, "trainer_1") is None  # all or nothing
    assert read_lease(storage, NODE).token == "other"  # type: ignore[union-attr]


def test_an_expired_lease_is_taken_over_and_said_as_information(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    storage = LocalPath(str(tmp_path))
    put_holder(storage, expires_at=10.0)
    with caplog.at_level(logging.INFO), WriterLease(storage, [NODE]) as lease:
        assert read_lease(storage, NODE).token == lease.token  # type: ignore[union-attr]
        assert lease.generations == {NODE: 4}
    assert "Taking over the writer lease of node 'trainer_0'" in caplog.text
    assert "host elsewhere" in caplog.text
    # a crashed job's restart is expected: information, not a warning
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_dead_holder_on_another_host_is_taken_over_within_one_ttl(storage: PathType) -> None:
    # a job on another host renewed its 1 s lease, then stopped (crashed, unplugged)
    ttl = 1.0
    renewed = time.time()
    put_holder(storage, renewed_at=renewed, expires_at=renewed + ttl)
    attempts = 0
    refused: list[float] = []
    while True:  # a job retried every 50 ms, judged by the lease's own timestamps
        attempts += 1
        try:
            lease = WriterLease(storage, [NODE], ttl=ttl)
            lease.acquire()
            break
        except LeaseHeldError as error:
            refused.append(error.expires_in)
            assert time.time() < renewed + ttl  # refused only while the lease is valid
            time.sleep(0.05)
    taken = time.time() - renewed
    try:
        assert ttl <= taken < ttl + 0.5
        assert attempts > 1
        assert all(wait <= ttl for wait in refused)
        assert lease.generations == {NODE: 4}
    finally:
        lease.release()


def test_a_dead_process_on_this_host_is_taken_over_at_once(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    put_holder(storage, host=socket.gethostname(), pid=int(dead.stdout))
    with WriterLease(storage, [NODE]) as lease:
        assert read_lease(storage, NODE).token == lease.token  # type: ignore[union-attr]


def test_a_killed_holder_not_yet_reaped_is_taken_over_at_once(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "holding"
        with pytest.raises(LeaseHeldError):  # alive: respected
            WriterLease(storage, [NODE]).acquire()
        os.kill(holder.pid, signal.SIGKILL)  # kill -9; this test, its parent, does not reap it
        deadline = time.monotonic() + 30
        while process_state(holder.pid) != "Z":
            assert time.monotonic() < deadline, "the killed holder never became a zombie"
            time.sleep(0.01)
        with WriterLease(storage, [NODE]) as lease:  # at once: a zombie writes nothing
            assert lease.generations == {NODE: 2}
        assert process_state(holder.pid) == "Z"  # still not reaped
    finally:
        holder.kill()
        holder.wait()


def process_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rpartition(")")[2].split()[0]


def test_an_unreadable_lease_is_taken_over(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    storage.put_document(lease_key(NODE), b"{not json")
    started = time.time()
    with WriterLease(storage, [NODE]) as lease:
        assert read_lease(storage, NODE).token == lease.token  # type: ignore[union-attr]
        # its generation is lost: the new one exceeds any counted one
        assert lease.generations[NODE] > started * 1000


def test_a_renewal_that_finds_the_lease_taken_over_marks_it_lost(storage: PathType) -> None:
    lease = WriterLease(storage, [NODE], ttl=100, heartbeat=False)
    lease.acquire()
    put_holder(storage, token="newcomer", generation=2)
    with pytest.raises(LeaseLostError, match="another job took it over") as caught:
        lease.renew()
    assert caught.value.generation == 1
    with pytest.raises(LeaseLostError):  # lost for good: the next save's check raises
        lease.check()
    lease.release()
    assert read_lease(storage, NODE).token == "newcomer"  # type: ignore[union-attr]


def test_the_heartbeat_finds_a_broken_lease_lost(storage: PathType) -> None:
    # 6 s (a heartbeat every 2 s): on a loaded machine a 1.5 s TTL could
    # lapse (lost for want of renewal) before the heartbeat read the broken lease.
    lease = WriterLease(storage, [NODE], ttl=6)
    lease.acquire()
    try:
        broken = break_lease(storage, NODE)
        assert broken is not None
        assert broken.token == lease.token
        deadline = time.monotonic() + 30
        while lease.lost is None:  # the heartbeat (every 2 s) finds it
            assert time.monotonic() < deadline, "the heartbeat never noticed"
            time.sleep(0.02)
        with pytest.raises(LeaseLostError, match="an operator broke it"):
            lease.check()
    finally:
        lease.release()
    after = read_lease_document(storage, NODE)
    assert after is not None
    assert (after.state, after.generation) == ("broken", 2)  # the release left it alone


def test_a_lease_left_by_an_ended_job_of_this_process_is_taken_over(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    put_holder(storage, host=socket.gethostname(), pid=os.getpid())  # its release failed
    with WriterLease(storage, [NODE]) as lease:
        assert read_lease(storage, NODE).token == lease.token  # type: ignore[union-attr]
        with pytest.raises(LeaseHeldError):  # but a live one of this process is respected
            WriterLease(storage, [NODE]).acquire()


def test_a_lease_time_that_is_not_positive_is_refused(tmp_path: Path) -> None:
    with pytest.raises(JobConfigurationError, match="positive number of seconds"):
        WriterLease(LocalPath(str(tmp_path)), [NODE], ttl=0)


def test_the_default_ttl_is_a_minute_at_most() -> None:
    from ckptstore.protocol import DEFAULT_LEASE_TTL

    assert DEFAULT_LEASE_TTL <= 60
    assert JobRunner.__init__.__kwdefaults__["lease_ttl"] <= 60  # type: ignore[index]


# -- through JobRunner -----------------------------------------------------------------


def long_epoch_job(seconds: float, epochs: int, during: list[object] | None = None) -> Job:
    """A one-node job whose epochs each take ``seconds`` (the work it simulates), and
    that runs ``during[0](epoch)`` at the end of each epoch when given."""
    epoch = [0]

    def train(ws: dict[str, object]) -> None:
        epoch[0] += 1
        time.sleep(seconds)  # the epoch's work, not a synchronisation
        ws["w"] = np.asarray(ws["w"]) + 1
        if during:
            during[0](epoch[0])  # type: ignore[operator]

    with Job() as job, Node(NODE):
        with job.init_group:
            Task(lambda ws: ws.update(w=np.zeros(4)), name="init")
        Task(train, name="train")
        epoch_limiter(job, epochs)
    return job


def test_a_job_whose_epochs_last_five_ttls_keeps_its_lease(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    ttl = 0.4
    seen: list[object] = []

    def compete(epoch: int) -> None:  # another job starting at the end of a long epoch
        holder = read_lease(storage, NODE)
        assert holder is not None
        seen.append(holder.renewed_at)
        with pytest.raises(LeaseHeldError):
            WriterLease(storage, [NODE], ttl=ttl).acquire()
        seen.append("refused")

    job = long_epoch_job(5 * ttl, 2, [compete])
    manager = MultiNodeCheckpointManager(str(tmp_path), "npz", metadata_handler="json")
    runner = JobRunner(job, manager, lease_ttl=ttl)
    assert runner.train(LocalSession()) == 2
    assert runner.committed_epochs == [0, 1, 2]
    assert seen[1::2] == ["refused", "refused"]
    first, second = seen[0::2]
    assert isinstance(first, float)
    assert isinstance(second, float)
    assert second - first >= 4 * ttl  # renewed during the epoch, with no save in it


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_a_writer_whose_lease_was_broken_cannot_commit(tmp_path: Path, async_save: bool) -> None:
    storage = LocalPath(str(tmp_path))

    def operator(epoch: int) -> None:
        if epoch == 2:
            assert break_lease(storage, NODE) is not None  # ckptstore lease break

    job = long_epoch_job(0, 4, [operator])
    manager = MultiNodeCheckpointManager(str(tmp_path), "npz", metadata_handler="json")
    runner = JobRunner(job, manager, async_save=async_save)
    with pytest.raises(LeaseLostError, match="an operator broke it") as caught:
        runner.train(LocalSession())
    assert caught.value.node == NODE
    # an async save of epoch 1 may still be in flight when the lease is broken: its
    # commit is refused too
    expected = ([0, 1], [0]) if async_save else ([0, 1],)
    assert runner.committed_epochs in expected
    for epoch in (1, 2, 3):  # refused right before their commit
        assert bool(committed_nodes(storage, epoch, [NODE])) == (epoch in runner.committed_epochs)
    with WriterLease(storage, [NODE], heartbeat=False) as lease:  # a new job starts at once
        assert lease.generations == {NODE: 3}


def test_a_storage_error_while_taking_the_lease_raises(
    s3_url: str, s3_faults: object, caplog: pytest.LogCaptureFixture
) -> None:
    from ckptstore.testing import FaultProxy

    assert isinstance(s3_faults, FaultProxy)
    job = long_epoch_job(0, 1)
    manager = MultiNodeCheckpointManager(s3_url, "npz", metadata_handler=None)
    s3_faults.fail_next(1000, status=403)  # permission denied: not retried
    with pytest.raises(StorageError):
        JobRunner(job, manager).train(LocalSession())
    s3_faults.clear_faults()
    assert "saving without it" not in caplog.text
    assert s3_faults.count(method="PUT") == 0  # nothing was saved


def expire_as_if_crashed(storage: PathType) -> None:
    """Make the released lease look held by a job on another host that stopped
    renewing (its generation kept): the next job takes it over."""
    holder = read_lease_document(storage, NODE)
    assert holder is not None
    crashed = replace(holder, state="held", host="elsewhere", expires_at=holder.started_at)
    storage.put_document(lease_key(NODE), crashed.encode())


def test_a_late_commit_of_the_old_holder_is_fenced_out_and_saved_over(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    manager = MultiNodeCheckpointManager(str(tmp_path), "npz", metadata_handler="json")
    JobRunner(long_epoch_job(0, 2), manager).train(LocalSession())  # epochs 0-2, generation 1
    expire_as_if_crashed(storage)

    def zombie(epoch: int) -> None:  # the old holder's create lands after the takeover
        if epoch == 3:
            commit = write_node(storage, NODE, 3, {"w": np.zeros(4)}, NpzDB(), ParallelIO())
            commit_epoch(storage, 3, [replace(commit, lease_generation=1)])
            assert CommitListing.of(storage).newest_complete([NODE]) == 2  # not counted

    manager = MultiNodeCheckpointManager(str(tmp_path), "npz", metadata_handler="json")
    runner = JobRunner(long_epoch_job(0, 4, [zombie]), manager)
    assert runner.train(LocalSession()) == 4
    assert runner.committed_epochs == [3, 4]
    record = read_commit(storage, 3, [NODE])
    assert record is not None
    assert record.nodes[NODE].lease_generation == 2  # the new holder's, saved over it
    stored = read_lease_document(storage, NODE)
    assert stored is not None
    assert stored.fences == ((2, 2),)


def test_a_takeover_never_hides_epochs_committed_before_it(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    manager = MultiNodeCheckpointManager(str(tmp_path), "npz", metadata_handler="json")
    JobRunner(long_epoch_job(0, 3), manager).train(LocalSession())  # epochs 0-3
    expire_as_if_crashed(storage)
    manager = MultiNodeCheckpointManager(str(tmp_path), "npz", metadata_handler="json")
    runner = JobRunner(long_epoch_job(0, 5), manager, resume_from_epoch=1)
    with pytest.raises(AlreadyCommittedError):  # write-once, as without a takeover
        runner.train(LocalSession())
    assert CommitListing.of(storage).newest_complete([NODE]) == 3  # still committed
    stored = read_lease_document(storage, NODE)
    assert stored is not None
    assert stored.fences == ((2, 3),)  # past every record listed at the takeover
