"""The conformance kit: reusable test classes for every ckptstore extension point.

A plugin author subclasses the class for their extension point in a test module and
provides its fixture; pytest then runs the whole contract against the plugin. See
``docs/conformance.md``.

The example writes such a test file and runs one of its tests with pytest.

Example::

    >>> import contextlib, io, pytest
    >>> kit = '''
    ... import pytest
    ... from ckptstore.builtin import NpzDB
    ... from ckptstore.testing.conformance import DBTypeConformance
    ...
    ... class TestNpz(DBTypeConformance):
    ...     @pytest.fixture
    ...     def db_type(self):
    ...         return NpzDB()  # MyFormat()
    ... '''
    >>> _ = open("test_npz_conformance.py", "w").write(kit)
    >>> with contextlib.redirect_stdout(io.StringIO()) as out:  # i.e. run pytest
    ...     code = pytest.main(["-q", "test_npz_conformance.py", "-k", "long_blob_name"])
    >>> int(code), out.getvalue().splitlines()[-1]
    (0, '1 passed, ...')
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
