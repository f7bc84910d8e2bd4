"""A save the object store refuses for want of (valid) credentials reports that cause:
the store's refusal or the missing credentials, never a clean-up step's failure, and
never the credential itself. On a moto server that checks credentials (moto's IAM
authentication, on after the request that creates the bucket)."""

from __future__ import annotations

import json
import secrets
import traceback
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from ckpt_helpers import without_aws
from cli_helpers import train

from ckptstore import JobRunner, MultiNodeCheckpointManager
from ckptstore.checkpoint._manager import CheckpointManager
from ckptstore.cli._main import main
from ckptstore.execution._session import LocalSession
from ckptstore.testing import MotoServer
from ckptstore.testing.conformance import counting_job

SECRET = f"SeCrEt-{secrets.token_hex(8)}"
KEY_ID = f"AKIA{secrets.token_hex(8).upper()}"
BUCKET = "guarded"


@pytest.fixture(scope="module")
def checking_server() -> Iterator[MotoServer]:
    """A moto S3 server that authenticates every request after the first (which creates
    the bucket): it answers unknown keys with 403 InvalidAccessKeyId."""
    with MotoServer(env={"INITIAL_NO_AUTH_ACTION_COUNT": "1"}) as server:
        server.create_bucket(BUCKET)
        yield server


@pytest.fixture
def no_aws_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No credential anywhere botocore looks (variables, files, instance metadata)."""
    without_aws(monkeypatch)


def save(server: MotoServer, **credentials: str) -> BaseException:
    """Save epoch 1 of one node to the server; the error it raised."""
    options = {"endpoint_url": server.endpoint_url, "retries": 0, **credentials}
    session = LocalSession()
    session.workspace("trainer_0")["w"] = np.ones(4)
    manager = CheckpointManager(f"s3://{BUCKET}/run", "trainer_0", "npz", storage_options=options)
    try:
        session.run(manager.init(["trainer_0"]))
        session.run(manager.save(1))
    except OSError as error:
        return error
    raise AssertionError("the save succeeded without valid credentials")


def everything_printed(error: BaseException, caplog: pytest.LogCaptureFixture) -> str:
    return "".join(traceback.format_exception(error)) + caplog.text


@pytest.mark.usefixtures("no_aws_environment")
def test_refused_credentials_are_the_reported_cause(
    checking_server: MotoServer, caplog: pytest.LogCaptureFixture
) -> None:
    error = save(checking_server, key=KEY_ID, secret=SECRET)
    message = str(error)
    assert "HTTP 403 InvalidAccessKeyId" in message
    assert "refused the credentials" in message
    assert "could not delete" not in everything_printed(error, caplog)
    assert SECRET not in everything_printed(error, caplog)
    assert KEY_ID not in everything_printed(error, caplog)


@pytest.mark.usefixtures("no_aws_environment")
def test_missing_credentials_are_the_reported_cause(
    checking_server: MotoServer, caplog: pytest.LogCaptureFixture
) -> None:
    error = save(checking_server)
    assert "NoCredentialsError: Unable to locate credentials" in str(error)
    assert "could not delete" not in everything_printed(error, caplog)


@pytest.mark.usefixtures("no_aws_environment")
def test_a_copy_with_refused_credentials_says_so_in_one_line(
    checking_server: MotoServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_url = str(tmp_path / "run")
    train(run_url, epochs=1)
    code = main(
        [
            "cp",
            run_url,
            f"s3://{BUCKET}/copy",
            "--dst-option",
            f"endpoint_url={checking_server.endpoint_url}",
            "--dst-option",
            "retries=0",
            "--dst-option",
            f"key={KEY_ID}",
            "--dst-option",
            f"secret={SECRET}",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 1
    (line,) = err.splitlines()
    assert "HTTP 403 InvalidAccessKeyId" in line
    assert "refused the credentials" in line
    assert SECRET not in err + out
    assert KEY_ID not in err + out


@pytest.mark.usefixtures("no_aws_environment")
def test_credentials_without_the_bucket_permission_are_the_reported_cause() -> None:
    """An IAM policy allowing a bucket's objects but not the bucket itself (no
    ``s3:ListBucket``: its HEAD and its listings answer 403): the job stops naming the
    refused request and its 403. It used to say only "Checkpoint files cannot be
    accessed" at every save, the bucket HEAD's 403 swallowed."""
    import boto3

    with MotoServer(env={"INITIAL_NO_AUTH_ACTION_COUNT": "4"}) as server:
        server.create_bucket(BUCKET)
        iam = boto3.client(
            "iam",
            endpoint_url=server.endpoint_url,
            region_name="us-east-1",
            aws_access_key_id="setup",
            aws_secret_access_key="setup",
        )
        iam.create_user(UserName="writer")
        objects_only = {
            "Version": "2012-10-17",
            "Statement": [
                {"Effect": "Allow", "Action": "s3:*", "Resource": f"arn:aws:s3:::{BUCKET}/*"}
            ],
        }
        iam.put_user_policy(
            UserName="writer", PolicyName="objects", PolicyDocument=json.dumps(objects_only)
        )
        key = iam.create_access_key(UserName="writer")["AccessKey"]
        options = {
            "endpoint_url": server.endpoint_url,
            "retries": 0,
            "key": key["AccessKeyId"],
            "secret": key["SecretAccessKey"],
        }
        manager = MultiNodeCheckpointManager(f"s3://{BUCKET}/run", "npz", storage_options=options)
        with pytest.raises(OSError, match="403") as info:
            JobRunner(counting_job(epochs=1), manager, save_retries=0).train(LocalSession())
    printed = "".join(traceback.format_exception(info.value))
    assert "HTTP 403 AccessDenied" in printed
    assert "cannot be accessed" not in printed
    assert key["SecretAccessKey"] not in printed
