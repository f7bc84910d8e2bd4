"""The plugin's fixtures: a fresh bucket per test, an environment that makes the URL
usable by any client, explicit options, and faults routed through a proxy."""

from __future__ import annotations

import os
from typing import Any

import fsspec
import pytest

from ckptstore.testing import FaultProxy, GcsEmulator, MotoServer

SEEN_BUCKETS: list[str] = []


def bucket_of(url: str) -> str:
    return url.split("://", 1)[1].split("/", 1)[0]


@pytest.mark.parametrize("run", [1, 2])
def test_each_test_gets_a_fresh_empty_bucket(s3_url: str, s3_server: MotoServer, run: int) -> None:
    bucket = bucket_of(s3_url)
    assert s3_url == f"s3://{bucket}/ckpt"
    assert "test-each-test-gets-a-fresh" in bucket
    assert s3_server.object_keys(bucket) == []
    assert bucket not in SEEN_BUCKETS
    for earlier in SEEN_BUCKETS:  # deleted when its test ended
        assert s3_server.request("HEAD", f"/{earlier}")[0] == 404
    SEEN_BUCKETS.append(bucket)


def test_the_s3_url_works_with_plain_s3fs_and_no_options(
    s3_url: str, s3_server: MotoServer
) -> None:
    assert os.environ["AWS_ENDPOINT_URL_S3"] == s3_server.endpoint_url
    fs, path = fsspec.core.url_to_fs(s3_url, skip_instance_cache=True)
    fs.pipe_file(f"{path}/hello.txt", b"hi")
    assert s3_server.object_keys(bucket_of(s3_url)) == ["ckpt/hello.txt"]


def test_explicit_s3_options_reach_the_server(
    s3_storage_options: dict[str, Any], s3_server: MotoServer
) -> None:
    assert s3_storage_options["endpoint_url"] == s3_server.endpoint_url
    s3_server.create_bucket("explicit")
    fs = fsspec.filesystem("s3", skip_instance_cache=True, **s3_storage_options)
    fs.pipe_file("explicit/k", b"v")
    assert fs.cat_file("explicit/k") == b"v"
    s3_server.delete_bucket("explicit")


def test_with_faults_the_url_and_options_go_through_the_proxy(
    s3_url: str, s3_storage_options: dict[str, Any], s3_faults: FaultProxy
) -> None:
    assert os.environ["AWS_ENDPOINT_URL_S3"] == s3_faults.endpoint_url
    assert s3_storage_options["endpoint_url"] == s3_faults.endpoint_url
    fs, path = fsspec.core.url_to_fs(s3_url, skip_instance_cache=True)
    fs.pipe_file(f"{path}/x", b"1")
    assert s3_faults.count("PUT") == 1


def test_the_environment_is_restored_after_a_test() -> None:
    for variable in ("AWS_ENDPOINT_URL_S3", "STORAGE_EMULATOR_HOST"):
        assert not os.environ.get(variable, "").startswith("http://127.0.0.1")


def test_gcs_url_and_options(
    gcs_url: str, gcs_storage_options: dict[str, Any], gcs_server: GcsEmulator
) -> None:
    assert os.environ["STORAGE_EMULATOR_HOST"] == gcs_server.endpoint_url
    assert gcs_storage_options["endpoint_url"] == gcs_server.endpoint_url
    bucket = bucket_of(gcs_url)
    assert gcs_url == f"gs://{bucket}/ckpt"
    assert gcs_server.object_keys(bucket) == []
    fs = fsspec.filesystem("gs", skip_instance_cache=True, **gcs_storage_options)
    fs.pipe_file(f"{bucket}/ckpt/a", b"1")
    assert gcs_server.object_keys(bucket) == ["ckpt/a"]


def test_gcs_faults_route_the_url_through_the_proxy(gcs_url: str, gcs_faults: FaultProxy) -> None:
    assert os.environ["STORAGE_EMULATOR_HOST"] == gcs_faults.endpoint_url
    fs, path = fsspec.core.url_to_fs(gcs_url, skip_instance_cache=True, token="anon")
    gcs_faults.fail_next(1, status=503)
    fs.pipe_file(f"{path}/x", b"1")  # gcsfs retries the 503 itself
    assert gcs_faults.count(outcome="failed") == 1
    assert gcs_faults.count("POST") >= 2
