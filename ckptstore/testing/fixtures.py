"""The fixtures of the ``ckptstore.testing`` pytest plugin.

Servers start the first time a test asks for them (one per test session and worker)
and stop at the end of the session; importing this module starts nothing.

=========================  ========  ==================================================
fixture                    scope     gives
=========================  ========  ==================================================
``s3_server``              session   a running :class:`~ckptstore.testing.MotoServer`
``s3_url``                 test      ``"s3://<fresh bucket>/ckpt"``, usable as is (the
                                     ``AWS_*`` environment points at the server)
``s3_storage_options``     test      ``{"endpoint_url": ..., "key": ..., ...}``
``s3_faults``              test      a :class:`~ckptstore.testing.FaultProxy` in front
                                     of the server; ``s3_url`` and
                                     ``s3_storage_options`` then go through it
``s3_mock_aws``            test      moto's ``mock_aws`` with S3 served in-process on
                                     127.0.0.1 (an :class:`InProcessMoto`): make
                                     buckets with boto3, checkpoint with ckptstore
``gcs_server`` ...         (same)    the same for GCS (gcp-storage-emulator),
``gcs_url``, ...                     ``"gs://<fresh bucket>/ckpt"``
``gcs_strict_server``      session   a GCS emulator that enforces ``ifGenerationMatch``
``gcs_strict_url``         test      ``"gs://<fresh bucket>/ckpt"`` on it
=========================  ========  ==================================================

Example::

    >>> import contextlib, io, pytest
    >>> tests = '''
    ... import numpy as np
    ... from ckptstore.tree import load_tree, save_tree
    ...
    ... def test_resume(s3_url, s3_faults):
    ...     s3_faults.fail_next(3, status=503)
    ...     save_tree(s3_url, 1, {"w": np.ones(2)})  # retried through the 503s
    ...     assert s3_faults.count(outcome="failed") == 3
    ...     assert load_tree(s3_url)["w"].tolist() == [1.0, 1.0]
    ... '''
    >>> _ = open("test_resume_through_503s.py", "w").write(tests)
    >>> with contextlib.redirect_stdout(io.StringIO()) as out:  # i.e. run pytest
    ...     code = pytest.main(["-q", "test_resume_through_503s.py"])
    >>> int(code), out.getvalue().splitlines()[-1]
    (0, '1 passed...')
"""

from __future__ import annotations

import importlib
import os
import re
import secrets
from collections.abc import Iterator
from typing import Any

import pytest

from ckptstore.testing.in_process import InProcessMoto, in_process_moto
from ckptstore.testing.proxy import FaultProxy
from ckptstore.testing.servers import GcsEmulator, MotoServer

__all__ = [
    "GCS_PROJECT",
    "TEST_CREDENTIALS",
    "gcs_faults",
    "gcs_server",
    "gcs_storage_options",
    "gcs_strict_server",
    "gcs_strict_url",
    "gcs_url",
    "s3_faults",
    "s3_mock_aws",
    "s3_server",
    "s3_storage_options",
    "s3_url",
]

TEST_CREDENTIALS = {"key": "testing", "secret": "testing"}
"""The (fake) credentials the S3 fixtures use; moto accepts any."""
GCS_PROJECT = "test-project"
PREFIX = "ckpt"


def bucket_name(request: pytest.FixtureRequest) -> str:
    """A fresh bucket name derived from the test's name (valid for S3 and GCS)."""
    stem = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    return f"t-{stem or 'test'}-{secrets.token_hex(4)}"


def _endpoint(request: pytest.FixtureRequest, server: Any, faults_fixture: str) -> str:
    if faults_fixture in request.fixturenames:
        proxy: FaultProxy = request.getfixturevalue(faults_fixture)
        return proxy.endpoint_url
    return str(server.endpoint_url)


# -- S3 (moto) --------------------------------------------------------------------------


@pytest.fixture(scope="session")
def s3_server() -> Iterator[MotoServer]:
    """A moto S3 server in a subprocess on 127.0.0.1, for the whole test session."""
    server = MotoServer()
    with server:
        yield server


@pytest.fixture
def s3_faults(s3_server: MotoServer) -> Iterator[FaultProxy]:
    """A fault-injecting proxy in front of the S3 server, for this test; ``s3_url`` and
    ``s3_storage_options`` go through it when a test uses both."""
    with FaultProxy(s3_server.endpoint_url, flavour="s3") as proxy:
        yield proxy


@pytest.fixture
def s3_storage_options(request: pytest.FixtureRequest, s3_server: MotoServer) -> dict[str, Any]:
    """Explicit storage options for the test S3 server (s3fs-compatible names)."""
    return {
        "endpoint_url": _endpoint(request, s3_server, "s3_faults"),
        **TEST_CREDENTIALS,
        "client_kwargs": {"region_name": "us-east-1"},
    }


@pytest.fixture
def s3_url(
    request: pytest.FixtureRequest, s3_server: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """``s3://<bucket>/ckpt`` in a bucket created for this test and deleted after it.

    The ``AWS_*`` environment variables point at the server for the test, so the URL
    works with no storage options (in ckptstore, s3fs and boto3 alike).
    """
    endpoint = _endpoint(request, s3_server, "s3_faults")
    name = bucket_name(request)
    s3_server.create_bucket(name)
    for variable in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(variable, raising=False)
    for variable, value in {
        "AWS_ACCESS_KEY_ID": TEST_CREDENTIALS["key"],
        "AWS_SECRET_ACCESS_KEY": TEST_CREDENTIALS["secret"],
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ENDPOINT_URL_S3": endpoint,
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_EC2_METADATA_DISABLED": "true",
    }.items():
        monkeypatch.setenv(variable, value)
    yield f"s3://{name}/{PREFIX}"
    if s3_server.running:
        s3_server.delete_bucket(name)


@pytest.fixture
def s3_mock_aws() -> Iterator[InProcessMoto]:
    """moto's in-process ``mock_aws`` for this test, its S3 also served over HTTP on
    127.0.0.1 (:func:`~ckptstore.testing.in_process_moto`). Plain ``mock_aws`` is enough
    for ckptstore; the server also lets s3fs and other aiobotocore code in the test see
    the buckets made with boto3."""
    from moto import mock_aws

    with mock_aws(), in_process_moto() as server:
        yield server


# -- GCS (gcp-storage-emulator) -----------------------------------------------------------


def use_plain_gcsfs(monkeypatch: pytest.MonkeyPatch) -> None:
    """For the test, make ``gs://`` URLs open gcsfs's plain filesystem: its default
    "extended" one first asks a gRPC API that emulators lack for the bucket's layout,
    and waits 60 s for each answer."""
    monkeypatch.setenv("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    try:
        from gcsfs.core import GCSFileSystem
    except ImportError:  # gcsfs not installed: nothing to adjust
        return
    registry = importlib.import_module("fsspec.registry")._registry
    for protocol in ("gs", "gcs"):
        monkeypatch.setitem(registry, protocol, GCSFileSystem)


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[GcsEmulator]:
    """A GCS emulator (gcp-storage-emulator) in a subprocess on 127.0.0.1, in memory,
    for the whole test session."""
    server = GcsEmulator()
    with server:
        yield server


@pytest.fixture
def gcs_faults(gcs_server: GcsEmulator) -> Iterator[FaultProxy]:
    """A fault-injecting proxy in front of the GCS emulator, for this test; ``gcs_url``
    and ``gcs_storage_options`` go through it when a test uses both."""
    with FaultProxy(gcs_server.endpoint_url, flavour="gcs") as proxy:
        yield proxy


@pytest.fixture
def gcs_storage_options(
    request: pytest.FixtureRequest, gcs_server: GcsEmulator, monkeypatch: pytest.MonkeyPatch
) -> dict[str, Any]:
    """Explicit storage options for the GCS emulator (gcsfs-compatible names)."""
    use_plain_gcsfs(monkeypatch)
    return {
        "endpoint_url": _endpoint(request, gcs_server, "gcs_faults"),
        "token": "anon",
        "project": GCS_PROJECT,
    }


@pytest.fixture
def gcs_url(
    request: pytest.FixtureRequest, gcs_server: GcsEmulator, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """``gs://<bucket>/ckpt`` in a bucket created for this test and deleted after it.

    ``STORAGE_EMULATOR_HOST`` points at the emulator for the test, so the URL works with
    no storage options (in ckptstore, gcsfs and google-cloud-storage alike).
    """
    yield from _gcs_bucket(
        request, gcs_server, monkeypatch, _endpoint(request, gcs_server, "gcs_faults")
    )


@pytest.fixture(scope="session")
def gcs_strict_server() -> Iterator[GcsEmulator]:
    """A GCS emulator that, as GCS does, refuses (412) an upload whose
    ``ifGenerationMatch`` does not hold (``GcsEmulator(enforce_preconditions=True)``),
    for the whole test session."""
    with GcsEmulator(enforce_preconditions=True) as server:
        yield server


@pytest.fixture
def gcs_strict_url(
    request: pytest.FixtureRequest, gcs_strict_server: GcsEmulator, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """As ``gcs_url``, on :func:`gcs_strict_server`: creates and conditional replaces
    race there as on GCS (exactly one of racing ``ifGenerationMatch`` uploads wins)."""
    yield from _gcs_bucket(request, gcs_strict_server, monkeypatch, gcs_strict_server.endpoint_url)


def _gcs_bucket(
    request: pytest.FixtureRequest,
    server: GcsEmulator,
    monkeypatch: pytest.MonkeyPatch,
    endpoint: str,
) -> Iterator[str]:
    """``gs://<fresh bucket>/ckpt`` on ``server``, reached at ``endpoint`` (the
    environment points there for the test); the bucket is deleted after it."""
    name = bucket_name(request)
    server.create_bucket(name, GCS_PROJECT)
    use_plain_gcsfs(monkeypatch)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", endpoint)
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", GCS_PROJECT)
    yield f"gs://{name}/{PREFIX}"
    if server.running:
        server.delete_bucket(name)
