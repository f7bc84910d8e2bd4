"""Conformance tests for upload builders (what a job does with its final checkpoint).

Subclass :class:`UploadBuilderConformance` and give it a ``make_builder`` fixture: a
factory building the builder for a destination URL (a fresh local directory unless
``upload_url`` is overridden). The contract checked is the one ``CopyUpload`` follows:
after the upload, the final epoch is committed at the destination, verifiable, and a
job can restore from there (``manager.load(epoch, path_prefix=dest)``).

Example::

    >>> import contextlib, io, pytest
    >>> kit = '''
    ... import pytest
    ... from ckptstore.builtin import CopyUpload
    ... from ckptstore.testing.conformance import UploadBuilderConformance
    ...
    ... class TestCopyUpload(UploadBuilderConformance):
    ...     @pytest.fixture
    ...     def make_builder(self):
    ...         return CopyUpload
    ... '''
    >>> _ = open("test_copy_upload_kit.py", "w").write(kit)
    >>> with contextlib.redirect_stdout(io.StringIO()) as out:  # i.e. run pytest
    ...     selected = "restores_from_the_destination"  # a few of the tests
    ...     code = pytest.main(["-q", "test_copy_upload_kit.py", "-k", selected])
    >>> int(code), out.getvalue().splitlines()[-1]
    (0, '1 passed, ...')
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from ckptstore import protocol
from ckptstore.checkpoint import JobRunner, MultiNodeCheckpointManager
from ckptstore.errors import CkptStoreError
from ckptstore.execution import LocalSession, TaskGroup
from ckptstore.io import ParallelIO
from ckptstore.plugin import UploadTaskGroupBuilder, get_registry
from ckptstore.testing.conformance.jobs import NODES, counting_job, expected_state
from ckptstore.testing.conformance.samples import assert_same_blob

__all__ = ["BuilderFactory", "UploadBuilderConformance"]

BuilderFactory = Callable[[str], UploadTaskGroupBuilder]


class UploadBuilderConformance:
    """The contract of upload builders. Needs ``make_builder(dest_url)``.

    Example::

        >>> import contextlib, io, pytest
        >>> kit = '''
        ... import pytest
        ... from ckptstore.builtin import CopyUpload
        ... from ckptstore.testing.conformance import UploadBuilderConformance
        ...
        ... class TestMine(UploadBuilderConformance):
        ...     @pytest.fixture
        ...     def make_builder(self):
        ...         return lambda url: CopyUpload(url)  # MyUpload(url)
        ... '''
        >>> _ = open("test_my_upload_kit.py", "w").write(kit)
        >>> with contextlib.redirect_stdout(io.StringIO()) as out:  # i.e. run pytest
        ...     selected = "task_group or source_is_left"  # a few of the tests
        ...     code = pytest.main(["-q", "test_my_upload_kit.py", "-k", selected])
        >>> int(code), out.getvalue().splitlines()[-1]
        (0, '2 passed, ...')
    """

    db_type = "npz"

    @pytest.fixture
    def checkpoint_url(self, tmp_path: Path) -> str:
        return str(tmp_path / "checkpoints")

    @pytest.fixture
    def upload_url(self, tmp_path: Path) -> str:
        return str(tmp_path / "uploaded")

    def trained(self, checkpoint_url: str, builder: UploadTaskGroupBuilder) -> JobRunner:
        manager = MultiNodeCheckpointManager(checkpoint_url, self.db_type)
        runner = JobRunner(counting_job(epochs=3), manager, upload_task_group_builder=builder)
        assert runner.train(LocalSession()) == 3
        return runner

    def test_build_returns_a_task_group(
        self, checkpoint_url: str, upload_url: str, make_builder: BuilderFactory
    ) -> None:
        runner = self.trained(checkpoint_url, make_builder(upload_url))
        assert runner.checkpoint_manager is not None
        group = make_builder(upload_url).build(3, runner.checkpoint_manager)
        assert isinstance(group, TaskGroup)
        assert group.tasks()

    def test_the_final_epoch_is_committed_and_verified_at_the_destination(
        self, checkpoint_url: str, upload_url: str, make_builder: BuilderFactory
    ) -> None:
        runner = self.trained(checkpoint_url, make_builder(upload_url))
        dest = get_registry().open_path(upload_url)
        assert protocol.committed_nodes(dest, 3) == set(NODES)
        assert protocol.committed_nodes(dest, 2) == set()
        manager = runner.checkpoint_manager
        assert manager is not None
        for node in NODES:
            engine = ParallelIO(manager.location.io_settings)
            assert protocol.verify_node(dest, node, 3, manager.db_type, engine) == []

    def test_a_job_restores_from_the_destination(
        self, checkpoint_url: str, upload_url: str, make_builder: BuilderFactory
    ) -> None:
        self.trained(checkpoint_url, make_builder(upload_url))
        manager = MultiNodeCheckpointManager(checkpoint_url, self.db_type)
        session = LocalSession()
        session.run(manager.init(list(NODES), retrieve_from_epoch=3, path_prefix=upload_url))
        session.run(manager.load(3, path_prefix=upload_url))
        for node in NODES:
            for name, blob in expected_state(node, 3).items():
                assert_same_blob(session.workspace(node)[name].copy(), blob)

    def test_the_source_is_left_as_it_was(
        self, checkpoint_url: str, upload_url: str, make_builder: BuilderFactory
    ) -> None:
        runner = self.trained(checkpoint_url, make_builder(upload_url))
        manager = runner.checkpoint_manager
        assert manager is not None
        for epoch in range(4):
            assert protocol.committed_nodes(manager.location, epoch) == set(NODES)

    def test_uploading_an_uncommitted_epoch_fails_and_commits_nothing(
        self, checkpoint_url: str, upload_url: str, make_builder: BuilderFactory
    ) -> None:
        runner = self.trained(checkpoint_url, make_builder(upload_url))
        assert runner.checkpoint_manager is not None
        with pytest.raises(CkptStoreError):
            LocalSession().run(make_builder(upload_url).build(7, runner.checkpoint_manager))
        dest = get_registry().open_path(upload_url)
        assert protocol.committed_nodes(dest, 7) == set()
