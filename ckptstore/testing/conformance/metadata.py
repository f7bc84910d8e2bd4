"""Conformance tests for metadata handlers (catalogs of committed epochs).

Subclass :class:`MetadataHandlerConformance` and give it a ``make_handler`` fixture
returning a factory: each call builds a new handler, as a new process would.

Beyond resuming correctly, the kit holds handlers to the catalog contract of
``docs/metadata.md``: the commit records are the truth, so epochs committed while the
catalog heard nothing (a deleted or stale catalog) are still resumed from, and
``write(epoch)`` called by several jobs at once loses no epoch (checked through
``epochs()`` when the handler has it, as every :class:`~ckptstore.builtin.IndexCatalog`
does).

Example::

    >>> import contextlib, io, pytest
    >>> kit = '''
    ... import pytest
    ... from ckptstore.builtin import SqliteCatalog
    ... from ckptstore.testing.conformance import MetadataHandlerConformance
    ...
    ... class TestSqlite(MetadataHandlerConformance):
    ...     @pytest.fixture
    ...     def make_handler(self, tmp_path):
    ...         return lambda: SqliteCatalog(tmp_path / "catalog.db")
    ... '''
    >>> _ = open("test_sqlite_catalog_kit.py", "w").write(kit)
    >>> with contextlib.redirect_stdout(io.StringIO()) as out:  # i.e. run pytest
    ...     code = pytest.main(["-q", "test_sqlite_catalog_kit.py", "-k", "newest_complete_epoch"])
    >>> int(code), out.getvalue().splitlines()[-1]
    (0, '1 passed, ...')
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from ckptstore import protocol
from ckptstore.checkpoint import JobRunner, MultiNodeCheckpointManager
from ckptstore.errors import CheckpointNotFoundError, CkptStoreError
from ckptstore.execution import LocalSession
from ckptstore.plugin import MetadataHandler
from ckptstore.records import ACTIONS, NodeStats
from ckptstore.testing.conformance.jobs import NODES, counting_job, expected_state
from ckptstore.testing.conformance.samples import assert_same_blob

__all__ = ["HandlerFactory", "MetadataHandlerConformance"]

HandlerFactory = Callable[[], MetadataHandler]


class MetadataHandlerConformance:
    """The contract every metadata handler honours. Needs ``make_handler``; override
    ``checkpoint_url`` to keep the checkpoints elsewhere than a local directory.

    Example::

        >>> import contextlib, io, pytest
        >>> kit = '''
        ... import pytest
        ... from ckptstore.builtin import JsonCatalog
        ... from ckptstore.testing.conformance import MetadataHandlerConformance
        ...
        ... class TestJson(MetadataHandlerConformance):
        ...     @pytest.fixture
        ...     def make_handler(self):
        ...         return JsonCatalog
        ... '''
        >>> _ = open("test_json_catalog_kit.py", "w").write(kit)
        >>> with contextlib.redirect_stdout(io.StringIO()) as out:  # i.e. run pytest
        ...     selected = "start_from_scratch or some_nodes_only"  # a few of the tests
        ...     code = pytest.main(["-q", "test_json_catalog_kit.py", "-k", selected])
        >>> int(code), out.getvalue().splitlines()[-1]
        (0, '2 passed, ...')
    """

    db_type = "npz"

    @pytest.fixture
    def checkpoint_url(self, tmp_path: Path) -> str:
        return str(tmp_path / "checkpoints")

    def manager(self, url: str, make_handler: HandlerFactory) -> MultiNodeCheckpointManager:
        """A manager for the test job's nodes, with a new handler, parameters set."""
        manager = MultiNodeCheckpointManager(url, self.db_type, metadata_handler=make_handler())
        manager.set_params(list(NODES))
        return manager

    def train(self, url: str, make_handler: HandlerFactory, epochs: int = 3) -> JobRunner:
        runner = JobRunner(counting_job(epochs=epochs), self.manager(url, make_handler))
        assert runner.train(LocalSession()) == epochs
        return runner

    def test_nothing_saved_means_start_from_scratch(
        self, checkpoint_url: str, make_handler: HandlerFactory
    ) -> None:
        assert self.manager(checkpoint_url, make_handler).get_resume_from_epoch_id(None) is None

    def test_resumes_from_the_newest_complete_epoch(
        self, checkpoint_url: str, make_handler: HandlerFactory
    ) -> None:
        self.train(checkpoint_url, make_handler)
        manager = self.manager(checkpoint_url, make_handler)
        assert manager.get_resume_from_epoch_id(None) == 3
        session = LocalSession()
        runner = JobRunner(counting_job(epochs=4), manager)
        assert runner.train(session) == 4  # the limit raised from 3 to 4: epoch 4 runs
        assert runner.committed_epochs == [4]
        for node in NODES:
            for name, blob in expected_state(node, 4).items():
                assert_same_blob(session.workspace(node)[name].copy(), blob)

    def test_a_chosen_epoch_must_be_committed_everywhere(
        self, checkpoint_url: str, make_handler: HandlerFactory
    ) -> None:
        self.train(checkpoint_url, make_handler)
        manager = self.manager(checkpoint_url, make_handler)
        assert manager.get_resume_from_epoch_id(2) == 2
        with pytest.raises(CheckpointNotFoundError, match="7"):
            manager.get_resume_from_epoch_id(7)

    def test_an_epoch_whose_commit_is_gone_is_never_chosen(
        self, checkpoint_url: str, make_handler: HandlerFactory
    ) -> None:
        runner = self.train(checkpoint_url, make_handler)
        assert runner.checkpoint_manager is not None
        location = runner.checkpoint_manager.location
        protocol.retract_epoch(location, 3, NODES)  # as a crashed re-save of epoch 3 leaves it
        assert self.manager(checkpoint_url, make_handler).get_resume_from_epoch_id(None) == 2

    def test_an_epoch_committed_on_some_nodes_only_is_skipped(
        self, checkpoint_url: str, make_handler: HandlerFactory
    ) -> None:
        runner = self.train(checkpoint_url, make_handler)
        assert runner.checkpoint_manager is not None
        location = runner.checkpoint_manager.location
        protocol.retract_epoch(location, 3, [NODES[1]])
        manager = self.manager(checkpoint_url, make_handler)
        assert manager.get_resume_from_epoch_id(None) == 2
        with pytest.raises(CheckpointNotFoundError):
            manager.get_resume_from_epoch_id(3)

    def test_writing_an_uncommitted_epoch_never_makes_it_resumable(
        self, checkpoint_url: str, make_handler: HandlerFactory
    ) -> None:
        self.train(checkpoint_url, make_handler, epochs=1)
        manager = self.manager(checkpoint_url, make_handler)
        with contextlib.suppress(CkptStoreError):
            manager.write_checkpoint_metadata(9)
        assert self.manager(checkpoint_url, make_handler).get_resume_from_epoch_id(None) == 1

    def test_reports_of_every_action_are_accepted(
        self, checkpoint_url: str, make_handler: HandlerFactory
    ) -> None:
        self.train(checkpoint_url, make_handler, epochs=1)
        manager = self.manager(checkpoint_url, make_handler)
        for action in ACTIONS:
            error = "disk full" if action == "checkpoint_save_failed" else None
            stats = {
                f"{checkpoint_url}/{node}.1": NodeStats(
                    node, 1, f"{checkpoint_url}/{node}.1", action, 1000, 256, 300, 2, error=error
                )
                for node in NODES
            }
            manager.report(action, stats)
        manager.report("checkpoint_save", {})
        assert manager.get_resume_from_epoch_id(None) == 1

    def test_checkpoints_are_accessible_on_a_writable_root(
        self, checkpoint_url: str, make_handler: HandlerFactory
    ) -> None:
        assert self.manager(checkpoint_url, make_handler).cp_accessible(None) is True

    def test_the_handler_sees_every_saved_epoch(
        self, checkpoint_url: str, make_handler: HandlerFactory
    ) -> None:
        self.train(checkpoint_url, make_handler, epochs=2)
        manager = self.manager(checkpoint_url, make_handler)
        for epoch in (0, 1, 2):
            assert manager.get_resume_from_epoch_id(epoch) == epoch
        loaded = LocalSession()
        manager.init(list(NODES))
        loaded.run(manager.init(list(NODES), retrieve_from_epoch=1))
        loaded.run(manager.load(1))
        assert np.all(loaded.workspace(NODES[1])[f"{NODES[1]}/w"] == 2.0)

    def test_epochs_committed_behind_the_catalogs_back_are_resumed_from(
        self, checkpoint_url: str, make_handler: HandlerFactory
    ) -> None:
        # the catalog never heard of these epochs: as if it were deleted or stale
        runner = JobRunner(
            counting_job(epochs=3), MultiNodeCheckpointManager(checkpoint_url, self.db_type)
        )
        assert runner.train(LocalSession()) == 3
        manager = self.manager(checkpoint_url, make_handler)
        assert manager.get_resume_from_epoch_id(None) == 3
        resumed = JobRunner(counting_job(epochs=4), manager)  # a raised limit
        assert resumed.train(LocalSession()) == 4  # resumed, not started over
        assert resumed.committed_epochs == [4]
        assert self.manager(checkpoint_url, make_handler).get_resume_from_epoch_id(None) == 4

    def test_concurrent_writes_lose_no_epoch(
        self, checkpoint_url: str, make_handler: HandlerFactory
    ) -> None:
        writers, per_writer = 4, 3
        last = writers * per_writer - 1
        runner = JobRunner(
            counting_job(epochs=last), MultiNodeCheckpointManager(checkpoint_url, self.db_type)
        )
        runner.train(LocalSession())
        assert runner.checkpoint_manager is not None
        location = runner.checkpoint_manager.location
        assert protocol.committed_epochs(location) == list(range(last + 1))
        start = threading.Barrier(writers)
        errors: list[BaseException] = []

        def write(epochs: list[int]) -> None:
            manager = self.manager(checkpoint_url, make_handler)
            start.wait()
            try:
                for epoch in epochs:
                    manager.write_checkpoint_metadata(epoch)
            except BaseException as error:  # reported below, in the test's thread
                errors.append(error)

        threads = [
            threading.Thread(target=write, args=(list(range(i, last + 1, writers)),))
            for i in range(writers)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        handler = self.manager(checkpoint_url, make_handler).metadata_handler
        assert handler is not None
        listing = getattr(handler, "epochs", None)
        if callable(listing):
            assert set(listing()) == set(range(last + 1))
        assert handler.last_epoch() == last
