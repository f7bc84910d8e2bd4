"""Links in ckptstore's own control files never stop a resume (docs/security.md): a
symbolic link in place of ``_ckptstore/epoch-N`` makes that epoch corrupt for the
library and the CLI alike (a resume falls back past it; ``verify`` and ``convert``
exit 3), and one in place of the catalog or the lease directory is replaced (they hold
nothing a load needs), never followed: what it points to stays untouched."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest

from ckptstore.checkpoint._multinode import MultiNodeCheckpointManager
from ckptstore.checkpoint._runner import JobRunner
from ckptstore.cli import main
from ckptstore.cli._common import EXIT_CORRUPT
from ckptstore.errors import CorruptCheckpointError
from ckptstore.execution._session import LocalSession
from ckptstore.records._layout import CONTROL_DIR, LEASE_DIR, epoch_commit_dir
from ckptstore.testing.conformance.jobs import NODES, counting_job
from tests.attacks.forge import EPOCH, OutsideWatch


@pytest.fixture
def run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    manager = MultiNodeCheckpointManager(str(run), "zarr", metadata_handler="json")
    assert JobRunner(counting_job(epochs=EPOCH), manager).train(LocalSession()) == EPOCH
    return run


def _move_out(path: Path, outside: Path) -> dict[str, bytes]:
    """Move ``path`` (a directory) outside the prefix, leave a link in its place, and
    return what the moved directory holds."""
    outside.mkdir(exist_ok=True)
    target = outside / path.name
    shutil.move(path, target)
    os.symlink(target, path)
    return {p.name: p.read_bytes() for p in sorted(target.rglob("*")) if p.is_file()}


def _held(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def _resume(run: Path, epochs: int) -> JobRunner:
    manager = MultiNodeCheckpointManager(str(run), "zarr", metadata_handler="json")
    runner = JobRunner(counting_job(epochs=epochs), manager)
    assert runner.train(LocalSession()) == epochs
    return runner


def test_a_linked_epoch_record_directory_is_corrupt_for_the_library_and_the_cli(
    run: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    outside = tmp_path / "outside"
    held = _move_out(run / epoch_commit_dir(EPOCH), outside)
    for argv in (
        ["verify", str(run), "--epoch", str(EPOCH)],
        ["convert", str(run), "--to", "npz", "--epoch", str(EPOCH), "--dest", str(tmp_path / "c")],
    ):
        assert main(argv) == EXIT_CORRUPT  # was 4, "not committed"
    manager = MultiNodeCheckpointManager(str(run), "zarr")
    session = LocalSession()
    session.run(manager.init(list(NODES)))
    with pytest.raises(CorruptCheckpointError, match=f"epoch-{EPOCH}"):
        session.run(manager.load(EPOCH))
    watch = OutsideWatch(outside)
    with caplog.at_level(logging.WARNING):
        runner = _resume(run, EPOCH + 1)  # resumed from the epoch before, never through it
    assert "resuming from epoch 1" in caplog.text
    assert runner.save_failures == []  # the link was removed: the epoch is saved again
    assert not (run / epoch_commit_dir(EPOCH)).is_symlink()
    session = LocalSession()
    manager = MultiNodeCheckpointManager(str(run), "zarr")
    session.run(manager.init(list(NODES)))
    session.run(manager.load(EPOCH))
    assert watch.events() == 0
    watch.close()
    assert _held(outside) == held


def test_a_linked_catalog_is_replaced_and_the_resume_goes_on(
    run: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    catalog = run / CONTROL_DIR / "catalog"
    held = _move_out(catalog, tmp_path / "outside")
    with caplog.at_level(logging.WARNING):
        _resume(run, EPOCH + 1)  # stopped with CorruptCheckpointError before
    assert "discarded the unreadable catalog" in caplog.text
    assert not catalog.is_symlink()
    assert sorted(p.name for p in catalog.iterdir()) == [f"epoch-{e}.json" for e in range(4)]
    assert _held(tmp_path / "outside") == held


def test_a_linked_lease_directory_is_replaced_and_the_resume_goes_on(
    run: Path, tmp_path: Path
) -> None:
    lease = run / LEASE_DIR
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "lease").mkdir()
    (tmp_path / "outside" / "lease" / "keep").write_bytes(b"not ckptstore's")
    shutil.rmtree(lease)
    os.symlink(tmp_path / "outside" / "lease", lease)
    _resume(run, EPOCH + 1)  # stopped with CorruptCheckpointError before
    assert not lease.is_symlink()
    assert _held(tmp_path / "outside") == {"keep": b"not ckptstore's"}


@pytest.mark.parametrize("name", ["trainer_0.3", ".trainer_0.3.staging-abc"])
def test_a_linked_node_directory_of_the_next_epoch_is_never_written_through(
    run: Path, tmp_path: Path, name: str
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, run / name)
    _resume(run, EPOCH + 1)
    assert list(outside.iterdir()) == []


def test_a_linked_sqlite_catalog_is_moved_aside_and_the_resume_goes_on(tmp_path: Path) -> None:
    run = tmp_path / "run"
    manager = MultiNodeCheckpointManager(str(run), "zarr", metadata_handler="sqlite")
    assert JobRunner(counting_job(epochs=EPOCH), manager).train(LocalSession()) == EPOCH
    database = run / CONTROL_DIR / "catalog.sqlite"
    outside = tmp_path / "outside.sqlite"
    shutil.move(database, outside)
    os.symlink(outside, database)
    before = outside.read_bytes()
    manager = MultiNodeCheckpointManager(str(run), "zarr", metadata_handler="sqlite")
    runner = JobRunner(counting_job(epochs=EPOCH + 1), manager)
    assert runner.train(LocalSession()) == EPOCH + 1  # stopped with CorruptCheckpointError before
    assert not database.is_symlink()
    assert outside.read_bytes() == before
