"""The GCS path type passes the path-type conformance kit, and every DB type that works
on object stores passes the DB-type kit on it, against a real GCS emulator."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from ckptstore_gcs import GCSPath

from ckptstore.db_type import DBType
from ckptstore.path_type import PathType
from ckptstore.plugin.registry import get_registry
from ckptstore.testing.conformance import DBTypeConformance, PathTypeConformance

OBJECT_STORE_DB_TYPES = sorted(
    name for name, cls in get_registry().db_types.items() if not cls.needs_rename
)


class TestGCSPathConformance(PathTypeConformance):
    @pytest.fixture
    def storage(self, gcs_url: str) -> Iterator[PathType]:
        storage = GCSPath(gcs_url)
        yield storage
        storage.close()


class TestDBTypesOnGCS(DBTypeConformance):
    @pytest.fixture(params=OBJECT_STORE_DB_TYPES)
    def db_type(self, request: pytest.FixtureRequest) -> DBType:
        return get_registry().db_type(str(request.param))

    @pytest.fixture
    def storage(self, gcs_url: str) -> Iterator[PathType]:
        storage = GCSPath(gcs_url)
        yield storage
        storage.close()


def test_the_urls_are_served_by_the_gcs_path_type() -> None:
    assert get_registry().path_type_for("gs://bucket/x") is GCSPath
    assert get_registry().path_type_for("gcs://bucket/x") is GCSPath
