"""The test kit of object-store path types: the path-type and DB-type conformance kits,
the options' common rules, and the scenarios every object store must survive against a
real server (from ``ckptstore.testing``) behind a fault proxy.

A plugin's test module subclasses :class:`ObjectStoreKit` and names its path type, the
``ckptstore.testing`` server it runs on and a few facts; its ``conftest.py`` imports
:func:`pytest_configure` and :func:`registry` from here. Tests of its own can use the
helpers of :mod:`ckptstore.testing.object_store.store` (``saver``, ``reload``...).

The example runs two of the kit's tests that need no server.

Example::

    >>> import contextlib, io, pytest
    >>> conftest = '''
    ... from ckptstore.testing.object_store import pytest_configure, registry
    ... '''
    >>> _ = open("conftest.py", "w").write(conftest)
    >>> tests = '''
    ... from ckptstore.testing.object_store import ObjectStoreKit
    ... from ckptstore_s3 import S3Path
    ...
    ... class TestMyStore(ObjectStoreKit):
    ...     path_type = S3Path  # MyStorePath
    ...     server = "s3"  # an S3-compatible store: the s3_url, s3_faults... fixtures
    ...     environment = ("AWS_ENDPOINT_URL_S3",)
    ...     part_size = 5 << 20
    ... '''
    >>> _ = open("test_conformance.py", "w").write(tests)
    >>> with contextlib.redirect_stdout(io.StringIO()) as out:  # i.e. run pytest
    ...     selected = "urls_are_served or unknown_options"
    ...     code = pytest.main(["-q", "test_conformance.py", "-k", selected])
    >>> int(code), out.getvalue().splitlines()[-1]
    (0, '2 passed...')
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ckptstore.plugin import DBType, Registry, get_registry, reset_registry
from ckptstore.testing.conformance import DBTypeConformance, PathTypeConformance
from ckptstore.testing.object_store.options import OptionsConformance
from ckptstore.testing.object_store.scenarios import ObjectStoreScenarios
from ckptstore.testing.object_store.store import (
    OnObjectStore,
    StoreUnderTest,
    object_store_db_types,
)

__all__ = [
    "ObjectStoreKit",
    "ObjectStoreScenarios",
    "OnObjectStore",
    "OptionsConformance",
    "StoreUnderTest",
    "pytest_configure",
    "registry",
]


class ObjectStoreKit(
    ObjectStoreScenarios, OptionsConformance, PathTypeConformance, DBTypeConformance
):
    """Everything an object-store path type's tests run: the path-type conformance kit,
    the DB-type conformance kit for every object-store DB type, the options' common
    rules and the scenarios.

    Example::

        >>> import contextlib, io, pytest
        >>> tests = '''
        ... from ckptstore.testing.object_store import ObjectStoreKit
        ... from ckptstore_s3 import S3Path
        ...
        ... class TestS3(ObjectStoreKit):
        ...     path_type = S3Path
        ...     server = "s3"
        ...     environment = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID")
        ...     part_size = 5 << 20
        ... '''
        >>> _ = open("test_s3_kit.py", "w").write(tests)
        >>> with contextlib.redirect_stdout(io.StringIO()) as out:  # i.e. run pytest
        ...     code = pytest.main(["-q", "test_s3_kit.py", "-k", "resaving_an_epoch_in_place"])
        >>> int(code), out.getvalue().splitlines()[-1]
        (0, '1 passed...')
    """

    @pytest.fixture(params=object_store_db_types())
    def db_type(self, request: pytest.FixtureRequest) -> DBType:
        return get_registry().db_type(str(request.param))


# -- for conftest.py ----------------------------------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    """Load the ``ckptstore.testing`` plugin (servers, buckets, fault proxy); installed,
    ckptstore registers it through its pytest11 entry point and this does nothing."""
    if not config.pluginmanager.has_plugin("ckptstore.testing"):
        config.pluginmanager.import_plugin("ckptstore.testing")


@pytest.fixture(autouse=True)
def registry() -> Iterator[Registry]:
    """A freshly built plugin registry, rebuilt again after the test."""
    fresh = reset_registry()
    yield fresh
    reset_registry()
