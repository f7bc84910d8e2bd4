"""The conformance kit: reusable test classes for every ckptstore extension point.

A plugin author subclasses the class for their extension point in a test module and
provides its fixture; pytest then runs the whole contract against the plugin. See
``docs/conformance.md``.

Example::

    from ckptstore.testing.conformance import DBTypeConformance

    class TestMyFormat(DBTypeConformance):
        @pytest.fixture
        def db_type(self) -> DBType:
            return MyFormat()
"""

from ckptstore.testing.conformance.db_type import Checkpoints, DBTypeConformance
from ckptstore.testing.conformance.jobs import NODES, counting_job, expected_state
from ckptstore.testing.conformance.metadata import HandlerFactory, MetadataHandlerConformance
from ckptstore.testing.conformance.path_type import PathTypeConformance
from ckptstore.testing.conformance.samples import (
    OPTIONAL_DTYPES,
    REQUIRED_DTYPES,
    SHAPES,
    assert_same_blob,
    dtype_sample,
)
from ckptstore.testing.conformance.storage import CountingPath, flip_byte, truncate
from ckptstore.testing.conformance.upload import BuilderFactory, UploadBuilderConformance

__all__ = [
    "NODES",
    "OPTIONAL_DTYPES",
    "REQUIRED_DTYPES",
    "SHAPES",
    "BuilderFactory",
    "Checkpoints",
    "CountingPath",
    "DBTypeConformance",
    "HandlerFactory",
    "MetadataHandlerConformance",
    "PathTypeConformance",
    "UploadBuilderConformance",
    "assert_same_blob",
    "counting_job",
    "dtype_sample",
    "expected_state",
    "flip_byte",
    "truncate",
]
