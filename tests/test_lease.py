"""Writer leases: held, renewed, released; a gone holder (expired, dead process on this
host, unreadable lease) is taken over with a warning, a live one is a LeaseHeldError."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ckptstore import LocalPath
from ckptstore.errors import JobConfigurationError, LeaseHeldError
from ckptstore.protocol import LeaseHolder, WriterLease, read_lease
from ckptstore.records._layout import lease_key

NODE = "trainer_0"


def put_holder(storage: LocalPath, **changes: object) -> LeaseHolder:
    values: dict[str, object] = {
        "node": NODE,
        "token": "other",
        "host": "elsewhere",
        "pid": 1,
        "started_at": 1000.0,
        "expires_at": 4e9,
    }
    values.update(changes)
    holder = LeaseHolder(**values)  # type: ignore[arg-type]
    storage.put_document(lease_key(NODE), holder.encode())
    return holder


def test_a_lease_is_held_renewed_and_released(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    now = [100.0]
    lease = WriterLease(storage, [NODE], ttl=60, clock=lambda: now[0])
    lease.acquire()
    holder = read_lease(storage, NODE)
    assert holder is not None
    assert (holder.token, holder.pid, holder.expires_at) == (lease.token, os.getpid(), 160.0)
    now[0] = 150.0
    lease.renew()
    assert read_lease(storage, NODE).expires_at == 210.0  # type: ignore[union-attr]
    lease.release()
    assert read_lease(storage, NODE) is None


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
    assert "Taking over the writer lease of node 'trainer_0'" in caplog.text
    assert "host elsewhere" in caplog.text
    # a crashed job's restart is expected: information, not a warning
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


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


def test_an_unreadable_lease_is_taken_over(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    storage.put_document(lease_key(NODE), b"{not json")
    with WriterLease(storage, [NODE]) as lease:
        assert read_lease(storage, NODE).token == lease.token  # type: ignore[union-attr]


def test_renewing_a_lease_another_job_took_over_raises(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    now = [1000.0]
    lease = WriterLease(storage, [NODE], ttl=100, clock=lambda: now[0])
    lease.acquire()
    put_holder(storage, token="newcomer")
    lease.renew()  # within a quarter of the ttl: nothing read or written
    assert read_lease(storage, NODE).token == "newcomer"  # type: ignore[union-attr]
    now[0] += 30  # later renewals look again
    with pytest.raises(LeaseHeldError, match="took the lease over"):
        lease.renew()
    lease.release()
    assert read_lease(storage, NODE).token == "newcomer"  # type: ignore[union-attr]


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
