"""moto's in-process mock_aws: plain, it is refused with a typed error that names the
adapter; with ckptstore.testing's adapter, checkpoints and boto3 share its buckets."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import boto3
import numpy as np
import pytest
from ckpt_helpers import without_aws
from moto import mock_aws

from ckptstore import (
    CheckpointManager,
    InProcessMockError,
    JobRunner,
    LocalSession,
    MultiNodeCheckpointManager,
)
from ckptstore.testing import InProcessMoto, in_process_moto
from ckptstore.tree import load_tree, save_tree


@pytest.fixture(autouse=True)
def _no_real_aws(monkeypatch: pytest.MonkeyPatch) -> None:
    """No endpoint or credentials from the machine or other fixtures leak in."""
    without_aws(monkeypatch)


def test_plain_mock_aws_is_refused_with_a_typed_error_naming_the_adapter() -> None:
    with mock_aws():
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="bucket")
        with pytest.raises(InProcessMockError) as caught:
            save_tree("s3://bucket/run", 1, {"w": np.ones(3)})
    message = str(caught.value)
    assert "s3_mock_aws" in message
    assert "in_process_moto" in message
    assert "s3://bucket/run/" in message  # the request that was intercepted
    assert "nothing is wrong with the location or the credentials" in message
    assert isinstance(caught.value, TypeError)
    assert "await" in str(caught.value.__cause__)  # aiobotocore's own error, kept as cause


def test_the_adapter_inside_mock_aws_shares_buckets_both_ways() -> None:
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="bucket")
        with in_process_moto() as server:
            assert server.endpoint_url.startswith("http://127.0.0.1:")
            save_tree("s3://bucket/run", 1, {"w": np.arange(4.0)})
            s3.put_object(Bucket="bucket", Key="run/made-by-boto3", Body=b"x")
            listed = [o["Key"] for o in s3.list_objects_v2(Bucket="bucket")["Contents"]]
            assert "run/_ckptstore/epoch-1/tree.commit.json" in listed
            assert load_tree("s3://bucket/run") == {"w": pytest.approx(np.arange(4.0))}
        assert "AWS_ENDPOINT_URL_S3" not in os.environ  # restored on exit
        # boto3 outside the adapter still sees what ckptstore wrote (one moto backend)
        body = s3.get_object(Bucket="bucket", Key="run/_ckptstore/epoch-1/tree.commit.json")["Body"]
        assert b'"epoch":1' in body.read().replace(b" ", b"")


def test_the_fixture_runs_a_job_that_resumes(s3_mock_aws: InProcessMoto) -> None:
    from ckpt_helpers import build_counter_job

    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="runs")
    job, _ = build_counter_job(epochs=2)
    manager = MultiNodeCheckpointManager("s3://runs/job", "npz", metadata_handler="json")
    assert JobRunner(job, manager).train(LocalSession()) == 2
    again = JobRunner(job, MultiNodeCheckpointManager("s3://runs/job", "npz", "json"))
    assert again.train(LocalSession()) == 2
    assert again.already_finished  # found epoch 2 through the mocked bucket
    keys = boto3.client("s3", region_name="us-east-1").list_objects_v2(Bucket="runs")
    assert "job/_ckptstore/epoch-2/trainer_0.commit.json" in [o["Key"] for o in keys["Contents"]]


def test_two_adapters_in_a_row_do_not_reuse_a_stale_endpoint() -> None:
    for round_ in range(2):
        with mock_aws(), in_process_moto():
            boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="bucket")
            manager = CheckpointManager("s3://bucket/run", "trainer_0", "npz")
            save_tree(manager, round_, {"round": round_})
            assert load_tree(manager) == {"round": round_}


def test_the_adapter_works_without_mock_aws_too() -> None:
    with in_process_moto() as server:
        boto3.client("s3", region_name="us-east-1", endpoint_url=server.endpoint_url).create_bucket(
            Bucket="plain"
        )
        save_tree("s3://plain/run", 0, {"ok": True})
        assert load_tree("s3://plain/run") == {"ok": True}


def test_the_documented_example_passes_as_users_run_it(tmp_path: Path) -> None:
    text = (Path(__file__).resolve().parents[3] / "docs" / "testing.md").read_text()
    blocks = re.findall(r"```python\n(# test_with_mock_aws\.py\n.*?)```", text, re.S)
    assert len(blocks) == 1, "docs/testing.md lost its mock_aws example"
    (tmp_path / "test_with_mock_aws.py").write_text(blocks[0])
    assert "pytest -p ckptstore.testing test_with_mock_aws.py" in text
    environment = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "ckptstore.testing",
            "-p",
            "no:cacheprovider",
            "-q",
            "test_with_mock_aws.py",
        ],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 passed" in result.stdout


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_a_job_under_plain_mock_aws_stops_at_once_unretried(
    async_save: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retrying cannot make mock_aws answer aiobotocore: the job stops at its first
    request with the typed error, however many retries were asked for."""
    from ckpt_helpers import build_counter_job
    from ckptstore_s3 import client

    refused: list[str] = []

    class CountedError(InProcessMockError):
        def __init__(self, request: str) -> None:
            refused.append(request)
            super().__init__(request)

    monkeypatch.setattr(client, "InProcessMockError", CountedError)
    with mock_aws():
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="bucket")
        job, _ = build_counter_job(epochs=3)
        manager = MultiNodeCheckpointManager("s3://bucket/job", "npz")
        runner = JobRunner(job, manager, save_retries=3, async_save=async_save)
        with pytest.raises(InProcessMockError):
            runner.train(LocalSession())
    assert len(refused) == 1, refused  # one request: neither the client nor the runner retried
    assert runner.save_failures == []  # not counted as a failed save: raised at once
    assert runner.committed_epochs == []
