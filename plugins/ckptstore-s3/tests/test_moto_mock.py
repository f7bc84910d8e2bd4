"""How the S3 plugin sees moto's in-process mock_aws: which endpoints it intercepts,
whether it is active (without importing moto), and the one server per process that
serves it."""

from __future__ import annotations

import multiprocessing
import os

import boto3
import pytest
from ckptstore_s3 import moto_mock
from moto import mock_aws

from ckptstore.testing import MotoServer, imported_modules
from ckptstore.tree import load_tree, save_tree


@pytest.mark.parametrize(
    "endpoint",
    [
        None,
        "https://s3.amazonaws.com",
        "https://s3.eu-west-1.amazonaws.com",
        "https://bucket.s3.us-east-2.amazonaws.com:443",
        "https://s3.cn-north-1.amazonaws.com.cn",
    ],
)
def test_aws_endpoints_are_intercepted(endpoint: str | None) -> None:
    assert moto_mock.intercepted(endpoint)


@pytest.mark.parametrize(
    "endpoint",
    ["http://127.0.0.1:9000", "https://minio.example.org", "https://notamazonaws.com"],
)
def test_other_endpoints_are_not(endpoint: str) -> None:
    assert not moto_mock.intercepted(endpoint)


def test_motos_custom_s3_endpoints_are_intercepted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOTO_S3_CUSTOM_ENDPOINTS", "http://ceph.local:8080, minio.local:9000")
    assert moto_mock.intercepted("http://ceph.local:8080")
    assert moto_mock.intercepted("https://minio.local:9000")
    assert not moto_mock.intercepted("http://ceph.local:9999")


def test_active_only_inside_the_mock() -> None:
    assert not moto_mock.mock_aws_active()
    with mock_aws():
        assert moto_mock.mock_aws_active()
        with mock_aws():  # nested
            assert moto_mock.mock_aws_active()
        assert moto_mock.mock_aws_active()
    assert not moto_mock.mock_aws_active()


def test_a_mock_passing_s3_through_to_aws_is_not_active_for_s3() -> None:
    with mock_aws(config={"core": {"passthrough": {"services": ["s3"]}}}):
        assert not moto_mock.mock_aws_active()
    with mock_aws(config={"core": {"passthrough": {"services": ["sqs"]}}}):
        assert moto_mock.mock_aws_active()


def test_the_server_starts_once_per_process() -> None:
    first = moto_mock.server_endpoint()
    assert first.startswith("http://127.0.0.1:")
    assert moto_mock.server_endpoint() == first


def test_without_an_active_mock_nothing_of_moto_is_imported_or_started(
    s3_server: MotoServer,
) -> None:
    """A plain S3 round trip imports no moto, werkzeug or flask; one after importing
    moto (a test suite that mocks elsewhere) still starts no server."""
    s3_server.create_bucket("import-cost")
    write = f"""
from ckptstore_s3 import S3Path, moto_mock
storage = S3Path("s3://import-cost/run", endpoint_url={s3_server.endpoint_url!r},
                 key="testing", secret="testing", region="us-east-1")
storage.write_bytes("a", b"data")
assert storage.read_bytes("a") == b"data"
"""
    assert imported_modules(write, ["moto", "werkzeug", "flask"]) == []
    after_moto = "import moto.core.models\n" + write + "assert moto_mock._server is None\n"
    assert imported_modules(after_moto, ["moto", "flask"]) == ["moto"]


def _child(queue: multiprocessing.Queue[object]) -> None:
    """In a forked child, still inside the parent's mock: its own backends, its own
    server."""
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="child")
    save_tree("s3://child/run", 1, {"in": "child"})
    listed = [item["Key"] for item in s3.list_objects_v2(Bucket="child")["Contents"]]
    queue.put((load_tree("s3://child/run"), listed, moto_mock.server_endpoint()))


def test_a_forked_child_serves_its_own_copy_of_the_mock() -> None:
    context = multiprocessing.get_context("fork")
    with mock_aws():
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="parent")
        save_tree("s3://parent/run", 1, {"in": "parent"})  # the parent's server is running
        queue: multiprocessing.Queue[object] = context.Queue()
        child = context.Process(target=_child, args=(queue,))
        child.start()
        tree, listed, endpoint = queue.get(timeout=120)  # type: ignore[misc]
        child.join(timeout=60)
        assert child.exitcode == 0
        assert tree == {"in": "child"}
        assert "run/_ckptstore/epoch-1/tree.commit.json" in listed
        assert endpoint != moto_mock.server_endpoint()
        names = [
            b["Name"] for b in boto3.client("s3", region_name="us-east-1").list_buckets()["Buckets"]
        ]
        assert names == ["parent"]  # the child's bucket was made in the child's backends
    assert os.getpid() == moto_mock._server[0]  # type: ignore[index]
