"""``ckptstore lease show`` and ``ckptstore lease break``: each node's holder, and
breaking a lease so a new job starts at once while the old holder can no longer commit."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import Cli

from ckptstore.builtin import LocalPath
from ckptstore.errors import LeaseLostError
from ckptstore.protocol import WriterLease, read_lease_document
from ckptstore.records._layout import lease_key


def test_show_lists_each_nodes_holder(cli: Cli, tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    with WriterLease(storage, ["trainer_1"], heartbeat=False):
        pass  # released
    lease = WriterLease(storage, ["trainer_0"], ttl=60, heartbeat=False)
    lease.acquire()
    try:
        result = cli("lease", "show", str(tmp_path))
        assert result.code == 0, result.err
        lines = result.out.splitlines()
        assert lines[0].startswith(f"trainer_0  held by host {socket.gethostname()}, pid ")
        assert f"pid {os.getpid()}, started " in lines[0]
        assert "valid until " in lines[0]
        assert "generation 1" in lines[0]
        assert lines[1] == "trainer_1  free (released, generation 1)"
        shown = cli("lease", "show", str(tmp_path), "--json").json()
        held = shown["leases"][0]
        assert (held["node"], held["state"], held["pid"]) == ("trainer_0", "held", os.getpid())
        assert (held["expired"], held["gone"]) == (False, False)
        assert held["expires_at"] > held["started_at"]
    finally:
        lease.release()


def test_show_marks_a_holder_that_is_gone(cli: Cli, tmp_path: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    storage = LocalPath(str(tmp_path))
    lease = WriterLease(storage, ["trainer_0"], heartbeat=False)
    lease.acquire()
    stored = read_lease_document(storage, "trainer_0")
    assert stored is not None
    forged = stored.__class__(**{**stored.__dict__, "pid": int(dead.stdout)})
    storage.put_document(lease_key("trainer_0"), forged.encode())
    result = cli("lease", "show", str(tmp_path))
    assert "(its job is gone: the next job takes it over)" in result.out


def test_show_on_a_root_without_leases_and_on_nothing(cli: Cli, tmp_path: Path) -> None:
    result = cli("lease", "show", str(tmp_path))
    assert (result.code, result.out.strip()) == (0, f"no writer lease under {tmp_path}")
    missing = cli("lease", "show", str(tmp_path / "nothing"))
    assert missing.code == 4
    assert "nothing at" in missing.err


def test_show_reports_an_unreadable_lease_as_corrupt(cli: Cli, tmp_path: Path) -> None:
    LocalPath(str(tmp_path)).put_document(lease_key("trainer_0"), b"{forged")
    result = cli("lease", "show", str(tmp_path), "--json")
    assert result.code == 3
    assert result.json()["leases"][0]["state"] == "unreadable"
    assert "Traceback" not in result.err


def test_break_frees_the_lease_at_once_and_fences_the_old_holder(cli: Cli, tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    old = WriterLease(storage, ["trainer_0"], ttl=600, heartbeat=False)
    old.acquire()
    result = cli("lease", "break", str(tmp_path), "--node", "trainer_0")  # no prompt
    assert result.code == 0, result.err
    assert result.out.startswith(f"trainer_0: broke the lease of host {socket.gethostname()}")
    assert "generation 1, now 2" in result.out
    with pytest.raises(LeaseLostError, match="an operator broke it"):
        old.verify()  # what its next commit checks
    with WriterLease(storage, ["trainer_0"], heartbeat=False) as new:  # at once
        assert new.generations == {"trainer_0": 3}
    old.release()


def test_break_of_a_node_without_a_lease_is_not_found(cli: Cli, tmp_path: Path) -> None:
    result = cli("lease", "break", str(tmp_path), "--node", "trainer_9", "--json")
    assert result.code == 4
    assert result.json()["broken"] == [
        {
            "node": "trainer_9",
            "had_lease": False,
            "was_held": False,
            "holder": None,
            "generation": None,
            "previous_generation": None,
        }
    ]


def test_lease_needs_an_action_and_break_a_node(cli: Cli, tmp_path: Path) -> None:
    assert cli("lease", str(tmp_path)).code == 2
    missing = cli("lease", "break", str(tmp_path))
    assert missing.code == 2
    assert "--node" in missing.err
