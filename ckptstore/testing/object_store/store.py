"""The object store a kit test runs on: which path type and server (:class:`OnObjectStore`),
what the scenarios know of it (:class:`StoreUnderTest`), and the helpers they share.

Example::

    >>> import boto3
    >>> from contextlib import ExitStack
    >>> from ckptstore.testing import in_process_moto
    >>> from ckptstore_s3 import S3Path
    >>> stack = ExitStack()
    >>> moto = stack.enter_context(in_process_moto())  # what the s3_* fixtures give a kit
    >>> _ = boto3.client("s3", endpoint_url=moto.endpoint_url).create_bucket(Bucket="kit")
    >>> faults = stack.enter_context(FaultProxy(moto.endpoint_url, flavour="s3"))
    >>> store = StoreUnderTest(S3Path, "s3://kit/ckpt", faults,
    ...                        {"endpoint_url": faults.endpoint_url},
    ...                        environment=("AWS_ENDPOINT_URL_S3",), part_size=5 << 20)
    >>> session = LocalSession()
    >>> manager = saver(store, session)  # trainer_0 holding store.blobs(), as npz
    >>> _ = session.run(manager.save(1))
    >>> assert_blobs(store, reload(manager, session, 1))
    >>> stack.close()
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pytest

from ckptstore.checkpoint import CheckpointManager
from ckptstore.execution import LocalSession, Node
from ckptstore.object_store import ObjectStorePath
from ckptstore.plugin import PathType, get_registry
from ckptstore.testing.conformance import NODES, expected_state
from ckptstore.testing.proxy import FaultProxy

__all__ = [
    "FAST",
    "HTTP_APIS",
    "HttpApi",
    "OnObjectStore",
    "StoreUnderTest",
    "assert_blobs",
    "assert_state",
    "object_store_db_types",
    "reload",
    "saver",
]

FAST = {"retry_base_delay": 0.01, "retry_max_delay": 0.05}
"""Storage options that make retries quick."""


@dataclass(frozen=True)
class HttpApi:
    """What the scenarios know of a store's HTTP API: the method of uploads, that of
    the request checking a bucket, and the reason its 503 answers give.

    Example::

        >>> HTTP_APIS["s3"].upload_method, HTTP_APIS["gcs"].throttling_reason
        ('PUT', 'backendError')
    """

    upload_method: str
    bucket_check_method: str
    throttling_reason: str


HTTP_APIS = {
    "s3": HttpApi(upload_method="PUT", bucket_check_method="HEAD", throttling_reason="SlowDown"),
    "gcs": HttpApi(
        upload_method="POST", bucket_check_method="GET", throttling_reason="backendError"
    ),
}
"""The APIs of the fault proxy's flavours."""


@dataclass(frozen=True)
class StoreUnderTest:
    """One object store as the scenarios see it.

    ``url`` is a fresh, empty root that works without storage options (the server's
    ``environment`` variables point at it) and ``storage_options`` the explicit options
    for it, both through ``faults``; ``part_size`` is the smallest part the store takes.

    Example::

        >>> from ckptstore_gcs import GCSPath
        >>> gcs_faults = FaultProxy("http://127.0.0.1:9023", flavour="gcs")  # not started
        >>> store = StoreUnderTest(GCSPath, "gs://bucket/ckpt", gcs_faults, {},
        ...                        environment=("STORAGE_EMULATOR_HOST",), part_size=1 << 20)
        >>> store.api.upload_method, {name: a.nbytes for name, a in store.blobs().items()}
        ('POST', {'big': 2621440, 'small': 800})
    """

    path_type: type[ObjectStorePath[Any, Any]]
    url: str
    faults: FaultProxy
    storage_options: dict[str, Any]
    environment: tuple[str, ...]
    part_size: int

    @property
    def api(self) -> HttpApi:
        """What the scenarios know of the store's HTTP API."""
        return HTTP_APIS[self.faults.flavour]

    def blobs(self) -> dict[str, np.ndarray[Any, Any]]:
        """A blob of two and a half parts (three parts) and a small one."""
        return {
            "big": np.arange(self.part_size * 5 // 8, dtype=np.float32),
            "small": np.arange(100, dtype=np.int64),
        }


def object_store_db_types() -> list[str]:
    """The registered DB types that work on object stores (no renames)."""
    return sorted(name for name, cls in get_registry().db_types.items() if not cls.needs_rename)


def assert_state(session: LocalSession, epoch: int) -> None:
    """Every node of :func:`~ckptstore.testing.conformance.counting_job` holds the state
    of ``epoch``."""
    for node in NODES:
        for name, value in expected_state(node, epoch).items():
            assert np.array_equal(session.workspace(node)[name], value), (node, name)


def saver(store: StoreUnderTest, session: LocalSession, **options: Any) -> CheckpointManager:
    """A manager saving ``trainer_0`` (holding :meth:`StoreUnderTest.blobs`) to the
    store as npz, with quick retries, parts of ``part_size`` and ``options``."""
    session.workspace("trainer_0").update(store.blobs())
    manager = CheckpointManager(
        store.url,
        "trainer_0",
        "npz",
        storage_options={**FAST, "part_size": store.part_size, **options},
    )
    with Node("trainer_0"):
        session.run(manager.init(["trainer_0"]))
    return manager


def reload(manager: CheckpointManager, session: LocalSession, epoch: int) -> dict[str, Any]:
    """``trainer_0``'s blobs loaded from ``epoch`` (over zeroed copies)."""
    workspace = session.workspace("trainer_0")
    names = list(workspace)
    for name in names:
        workspace[name] = np.zeros(1)
    session.run(manager.load(epoch))
    return {name: workspace[name] for name in names}


def assert_blobs(store: StoreUnderTest, found: dict[str, Any]) -> None:
    """``found`` holds exactly :meth:`StoreUnderTest.blobs`."""
    for name, value in store.blobs().items():
        assert np.array_equal(found[name], value), name


class OnObjectStore:
    """Which store a kit class runs on: ``path_type``, and ``server``, the prefix of the
    ``ckptstore.testing`` fixtures giving its roots (``"s3"``: ``s3_url``...). Its
    ``storage`` fixture is a fresh root, straight to the server.

    Example::

        >>> import contextlib, io, pytest
        >>> tests = '''
        ... from ckptstore.testing.conformance import PathTypeConformance
        ... from ckptstore.testing.object_store import OnObjectStore
        ... from ckptstore_s3 import S3Path
        ...
        ... class TestMyStore(OnObjectStore, PathTypeConformance):
        ...     path_type = S3Path
        ...     server = "s3"  # storage: a fresh s3_url root
        ... '''
        >>> _ = open("test_on_s3_kit.py", "w").write(tests)
        >>> with contextlib.redirect_stdout(io.StringIO()) as out:  # i.e. run pytest
        ...     code = pytest.main(["-q", "test_on_s3_kit.py", "-k", "urls_are_served"])
        >>> int(code), out.getvalue().splitlines()[-1]
        (0, '1 passed...')
    """

    path_type: ClassVar[type[ObjectStorePath[Any, Any]]]
    server: ClassVar[str]

    @pytest.fixture
    def storage(self, request: pytest.FixtureRequest) -> Iterator[PathType]:
        storage = self.path_type(request.getfixturevalue(f"{self.server}_url"))
        yield storage
        storage.close()

    def test_the_urls_are_served_by_the_path_type(self) -> None:
        registry = get_registry()
        for scheme in self.path_type.protocols:
            assert registry.path_type_for(f"{scheme}://bucket/x") is self.path_type
        assert "npz" in object_store_db_types()
