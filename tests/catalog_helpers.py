"""Shared by the catalog tests: train a run, damage its catalog, check the resume."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from ckptstore.builtin._catalog import IndexCatalog
from ckptstore.checkpoint._multinode import MultiNodeCheckpointManager
from ckptstore.checkpoint._runner import JobRunner
from ckptstore.execution._session import LocalSession
from ckptstore.records._layout import LEASE_DIR
from ckptstore.testing.conformance import NODES, counting_job, expected_state
from ckptstore.testing.conformance.samples import assert_same_blob

CatalogFactory = Callable[[], IndexCatalog]


def train(url: str, make: CatalogFactory, epochs: int) -> JobRunner:
    """Run the conformance job to ``epochs`` under ``url`` with a new catalog."""
    runner = JobRunner(
        counting_job(epochs=epochs),
        MultiNodeCheckpointManager(url, "npz", metadata_handler=make()),
    )
    runner.train(LocalSession())
    return runner


def snapshot(root: Path, skip: Callable[[Path], bool]) -> dict[str, str]:
    """SHA-256 of every file under ``root`` that ``skip`` does not exclude, leases left
    out: a lease document stays after its release and is rewritten by the next job."""
    leases = root / LEASE_DIR
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file() and not skip(path) and leases not in path.parents
    }


def assert_resumes_from(
    root: Path,
    make: CatalogFactory,
    newest: int,
    before: dict[str, str],
    skip: Callable[[Path], bool],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A new job resumes from ``newest`` (its state is the one saved then), runs one
    more epoch, overwrites nothing saved before, warns that it rebuilt the catalog,
    and leaves a catalog listing every committed epoch."""
    with caplog.at_level(logging.WARNING):
        session = LocalSession()
        manager = MultiNodeCheckpointManager(str(root), "npz", metadata_handler=make())
        runner = JobRunner(counting_job(epochs=newest + 1), manager)
        assert runner.train(session) == newest + 1
    assert "rebuilt it" in caplog.text
    assert runner.committed_epochs == [newest + 1]
    for node in NODES:
        for name, blob in expected_state(node, newest + 1).items():
            assert_same_blob(session.workspace(node)[name].copy(), blob)
    after = snapshot(root, skip)
    assert {key: after.get(key) for key in before} == before  # nothing overwritten
    handler = make()
    handler.set_params(str(root), "npz", list(NODES), storage=manager.location.storage)
    assert sorted(handler._read_entries()) == list(range(newest + 2))  # repaired


def assert_repairs_damage(
    root: Path,
    make: CatalogFactory,
    damage: Callable[[Path], None],
    skip: Callable[[Path], bool],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Train five epochs under ``root``, ``damage`` the catalog (the files ``skip``
    selects), then :func:`assert_resumes_from` epoch 5 with everything else intact."""
    train(str(root), make, epochs=5)
    before = snapshot(root, skip)
    damage(root)
    assert_resumes_from(root, make, 5, before, skip, caplog)


def write_epochs(
    url: str, node: str, epochs: list[int], database: str | None, start: object
) -> None:
    """A writer process: save and commit each of ``epochs`` for ``node`` through the
    manager API and catalog it (json, or sqlite in ``database``), after ``start``
    (a ``multiprocessing.Barrier``) lets every writer go at once."""
    import numpy as np

    from ckptstore.builtin._json_catalog import JsonCatalog
    from ckptstore.builtin._sqlite_catalog import SqliteCatalog
    from ckptstore.checkpoint._manager import CheckpointManager

    handler = JsonCatalog() if database is None else SqliteCatalog(database)
    manager = CheckpointManager(url, node, "npz", metadata_handler=handler)
    manager.set_params([node])
    session = LocalSession()
    session.workspace(node)["w"] = np.zeros(4)
    session.run(manager.init([node]))
    start.wait()  # type: ignore[attr-defined]
    for epoch in epochs:
        session.workspace(node)["w"][:] = epoch
        session.run(manager.save(epoch))
        manager.write_checkpoint_metadata(epoch)


def two_writers(url: str, database: str | None, per_writer: int = 24) -> set[int]:
    """Two processes on ``url``: trainer_0 writes the even epochs, trainer_1 the odd
    ones, ``per_writer`` each, at the same time. Returns every epoch written."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    start = context.Barrier(2)
    plans = {
        "trainer_0": [2 * i for i in range(per_writer)],
        "trainer_1": [2 * i + 1 for i in range(per_writer)],
    }
    processes = [
        context.Process(target=write_epochs, args=(url, node, epochs, database, start))
        for node, epochs in plans.items()
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=300)
        assert process.exitcode == 0
    return {epoch for epochs in plans.values() for epoch in epochs}
