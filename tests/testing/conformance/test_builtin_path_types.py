"""The built-in path types pass the path-type conformance kit."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ckptstore.paths._fsspec_path import FsspecPath
from ckptstore.paths._local_path import LocalPath
from ckptstore.plugin._path_type import PathType
from ckptstore.testing.conformance import PathTypeConformance


class TestLocalPath(PathTypeConformance):
    @pytest.fixture(params=["syncfs", "fsync", "none"])
    def storage(self, tmp_path: Path, request: pytest.FixtureRequest) -> PathType:
        return LocalPath(str(tmp_path / "root"), durability=str(request.param))


class TestFsspecMemoryPath(PathTypeConformance):
    @pytest.fixture
    def storage(self) -> Iterator[PathType]:
        storage = FsspecPath(f"memory://conformance-{uuid.uuid4().hex}")
        yield storage
        if storage.fs.exists(storage.root):
            storage.fs.rm(storage.root, recursive=True)
