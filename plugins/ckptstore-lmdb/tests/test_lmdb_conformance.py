"""The ``lmdb`` DB type passes the ckptstore conformance kit."""

from __future__ import annotations

import pytest
from ckptstore_lmdb import LmdbDB

from ckptstore.plugin._db_type import DBType
from ckptstore.testing.conformance import DBTypeConformance


class TestLmdbConformance(DBTypeConformance):
    refusable_dtypes = ()  # LMDB stores raw bytes: every ckptstore dtype round-trips

    @pytest.fixture
    def db_type(self) -> DBType:
        return LmdbDB()
