"""Every registered DB type (built-ins and installed plugins) passes the conformance kit."""

from __future__ import annotations

import pytest

from ckptstore.plugin._db_type import DBType
from ckptstore.plugin._registry import get_registry
from ckptstore.testing.conformance import DBTypeConformance

REGISTERED = sorted(get_registry().db_types)


class TestRegisteredDBType(DBTypeConformance):
    refusable_dtypes = ()  # zarr, npz and lmdb store every plain dtype (docs/values.md)

    @pytest.fixture(params=REGISTERED)
    def db_type(self, request: pytest.FixtureRequest) -> DBType:
        return get_registry().db_type(str(request.param))


def test_the_built_in_formats_are_covered() -> None:
    assert {"npz", "zarr"} <= set(REGISTERED)
