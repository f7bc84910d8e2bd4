"""The S3 path type passes the path-type conformance kit, and every DB type that works
on object stores passes the DB-type kit on it, against a real moto server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from ckptstore_s3 import S3Path

from ckptstore.db_type import DBType
from ckptstore.path_type import PathType
from ckptstore.plugin.registry import get_registry
from ckptstore.testing.conformance import DBTypeConformance, PathTypeConformance

OBJECT_STORE_DB_TYPES = sorted(
    name for name, cls in get_registry().db_types.items() if not cls.needs_rename
)


class TestS3PathConformance(PathTypeConformance):
    @pytest.fixture
    def storage(self, s3_url: str) -> Iterator[PathType]:
        storage = S3Path(s3_url)
        yield storage
        storage.close()


class TestDBTypesOnS3(DBTypeConformance):
    @pytest.fixture(params=OBJECT_STORE_DB_TYPES)
    def db_type(self, request: pytest.FixtureRequest) -> DBType:
        return get_registry().db_type(str(request.param))

    @pytest.fixture
    def storage(self, s3_url: str) -> Iterator[PathType]:
        storage = S3Path(s3_url)
        yield storage
        storage.close()


def test_the_object_store_formats_are_covered() -> None:
    assert "npz" in OBJECT_STORE_DB_TYPES
    assert get_registry().path_type_for("s3://bucket/x") is S3Path
    assert get_registry().path_type_for("s3a://bucket/x") is S3Path
