"""The benchmarks' machine settings: free page reporting is off only for the run."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import system


@pytest.fixture
def reporting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in for the balloon's ``page_reporting_order`` parameter, at order 9."""
    order = tmp_path / "page_reporting_order"
    order.write_text("9\n")
    monkeypatch.setattr(system, "PAGE_REPORTING_ORDER", order)
    monkeypatch.setattr(system, "WARM_LIMIT", 1 << 20)
    return order


def test_reporting_is_off_during_the_run_and_restored_after(reporting: Path) -> None:
    with system.memory_kept() as note:
        assert reporting.read_text() == system.NO_REPORTING
        assert "reporting to the VM's host off for the run" in note
    assert reporting.read_text() == "9"


def test_reporting_is_restored_when_the_run_fails(reporting: Path) -> None:
    with pytest.raises(RuntimeError, match="a trial failed"), system.memory_kept():
        raise RuntimeError("a trial failed")
    assert reporting.read_text() == "9"


def test_smoke_runs_leave_the_machine_alone(reporting: Path) -> None:
    with system.memory_kept(enabled=False) as note:
        assert reporting.read_text() == "9\n"
    assert note == ""


def test_a_machine_without_reporting_needs_no_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(system, "PAGE_REPORTING_ORDER", tmp_path / "absent")
    with system.memory_kept() as note:
        assert note == ""


def test_a_setting_that_cannot_be_changed_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    # a file every process can read and none can write, root included
    monkeypatch.setattr(system, "PAGE_REPORTING_ORDER", Path("/proc/self/stat"))
    with system.memory_kept() as note:
        assert "could not stop it" in note
