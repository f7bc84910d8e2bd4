"""The benchmarks' machine settings: free page reporting is off, a disk limit on, and an
environment variable set, only for the run."""

from __future__ import annotations

import os
import subprocess
import sys
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


def _blkio_group_of(pid: int | str) -> str:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, group = line.split(":", 2)
        if "blkio" in controllers.split(","):
            return group
    raise AssertionError(f"process {pid} is in no blkio cgroup")


needs_blkio = pytest.mark.skipif(
    os.geteuid() != 0 or not (system.BLKIO / "blkio.throttle.write_bps_device").exists(),
    reason="a disk limit needs root and cgroup v1's blkio throttle",
)


@needs_blkio
def test_a_disk_limit_holds_for_the_run_and_its_children_then_is_lifted(tmp_path: Path) -> None:
    home = _blkio_group_of("self")
    device = system.block_device(tmp_path)
    with system.disk_limited(tmp_path, 4096) as note:
        group = _blkio_group_of("self")
        assert group != home
        limits = system.BLKIO / group.lstrip("/")
        for kind in ("write", "read"):
            written = (limits / f"blkio.throttle.{kind}_bps_device").read_text().split()
            assert written == [device, str(4096 << 20)]
        child = subprocess.run(
            [sys.executable, "-c", "print(open('/proc/self/cgroup').read())"],
            capture_output=True,
            text=True,
            check=True,
        )
        assert f"blkio:{group}\n" in child.stdout
        assert "limited to 4096 MiB/s" in note
    assert _blkio_group_of("self") == home
    assert not limits.exists()


@needs_blkio
def test_a_disk_limit_is_lifted_when_the_run_fails(tmp_path: Path) -> None:
    home = _blkio_group_of("self")
    groups: list[Path] = []

    def trial() -> None:
        groups.append(system.BLKIO / _blkio_group_of("self").lstrip("/"))
        raise RuntimeError("a trial failed")

    with pytest.raises(RuntimeError, match="a trial failed"), system.disk_limited(tmp_path, 4096):
        trial()
    limits = groups[0]
    assert limits != system.BLKIO / home.lstrip("/")
    assert _blkio_group_of("self") == home
    assert not limits.exists()


def test_no_disk_limit_touches_nothing(tmp_path: Path) -> None:
    home = _blkio_group_of("self")
    with system.disk_limited(tmp_path, None) as note:
        assert _blkio_group_of("self") == home
    assert note == ""


def test_a_disk_limit_needs_a_disk() -> None:
    with (
        pytest.raises(ValueError, match="on no block device"),
        system.disk_limited(Path("/dev/shm"), 250),
    ):
        raise AssertionError("the body ran")


def test_a_disk_limit_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="must be positive"), system.disk_limited(tmp_path, 0):
        raise AssertionError("the body ran")


@pytest.mark.parametrize("before", [None, "7"])
def test_an_environment_variable_is_set_meanwhile_then_as_it_was(
    monkeypatch: pytest.MonkeyPatch, before: str | None
) -> None:
    name = "CKPTSTORE_BENCH_PROBE"
    if before is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, before)
    seen: list[str] = []

    def failing_tool() -> None:
        with system.environment_variable(name, "1"):
            seen.append(os.environ[name])
            raise RuntimeError("a tool failed")  # restored all the same

    with pytest.raises(RuntimeError, match="a tool failed"):
        failing_tool()
    assert seen == ["1"]
    assert os.environ.get(name) == before


HELPERS = {"network"}
"""Benchmark modules with a ``main`` that measure nothing themselves (a relay)."""


def test_every_benchmark_keeps_freed_memory_while_it_measures() -> None:
    # docs/benchmarks.md, "Reading these numbers": the benchmarks switch reporting off
    benchmarks = Path(system.__file__).parent
    measuring = [
        path.stem
        for path in sorted(benchmarks.glob("*.py"))
        if "def main(" in path.read_text() and path.stem not in HELPERS
    ]
    assert len(measuring) >= 10
    assert [
        name for name in measuring if "memory_kept(" not in (benchmarks / f"{name}.py").read_text()
    ] == []
