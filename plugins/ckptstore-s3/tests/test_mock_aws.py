"""moto's in-process mock_aws, plain: inside ``with mock_aws():`` or under ``@mock_aws``,
checkpoints to S3 just work, on the mock's own buckets (what boto3 made in the mock,
ckptstore sees, and the other way round). What mock_aws intercepts that the plugin does
not expect still fails at once with a typed error naming the way out."""

from __future__ import annotations

import concurrent.futures
import os
import re
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import boto3
import numpy as np
import pytest
from ckpt_helpers import without_aws
from ckptstore_s3 import S3Path
from moto import mock_aws

from ckptstore import (
    CheckpointManager,
    JobRunner,
    LocalSession,
    MultiNodeCheckpointManager,
    StorageError,
)
from ckptstore.cli import main
from ckptstore.errors import InProcessMockError
from ckptstore.testing import FaultProxy, InProcessMoto, in_process_moto
from ckptstore.tree import load_tree, save_tree

MiB = 1 << 20
ISO_ENDPOINT = "https://s3.us-iso-east-1.c2s.ic.gov"
"""An AWS endpoint (an isolated region's) that mock_aws intercepts, which the S3 plugin
does not know as AWS's: its requests still reach the mock in-process."""


@pytest.fixture(autouse=True)
def _no_real_aws(monkeypatch: pytest.MonkeyPatch) -> None:
    """No endpoint or credentials from the machine or other fixtures leak in."""
    without_aws(monkeypatch)


def keys(bucket: str) -> list[str]:
    """The bucket's keys, as boto3 in the mock lists them."""
    listed = boto3.client("s3", region_name="us-east-1").list_objects_v2(Bucket=bucket)
    return [item["Key"] for item in listed.get("Contents", [])]


def test_with_mock_aws_a_round_trip_needs_no_other_line() -> None:
    with mock_aws():
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="bucket")
        save_tree("s3://bucket/run", 1, {"w": np.arange(4.0), "step": 1})
        loaded = load_tree("s3://bucket/run")
        assert loaded["step"] == 1
        assert np.array_equal(loaded["w"], np.arange(4.0))
        assert "run/_ckptstore/epoch-1/tree.commit.json" in keys("bucket")  # boto3 sees it


@mock_aws
def test_under_the_mock_aws_decorator_buckets_are_shared_both_ways() -> None:
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="shared")
    s3.put_object(Bucket="shared", Key="run/made-by-boto3", Body=b"from boto3")
    storage = S3Path("s3://shared/run")
    assert storage.read_bytes("made-by-boto3") == b"from boto3"
    storage.write_bytes("made-by-ckptstore", b"from ckptstore")
    body = s3.get_object(Bucket="shared", Key="run/made-by-ckptstore")["Body"].read()
    assert body == b"from ckptstore"
    assert storage.list_keys() == ["made-by-boto3", "made-by-ckptstore"]
    storage.delete(["made-by-boto3"])
    assert keys("shared") == ["run/made-by-ckptstore"]


@mock_aws
class TestTheDecoratorOnAClass:
    """``@mock_aws`` on a test class mocks each of its tests."""

    def test_a_manager_saves_and_loads(self) -> None:
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="models")
        session = LocalSession()
        session.workspace("trainer_0")["w"] = np.arange(3.0)
        manager = CheckpointManager("s3://models/run", "trainer_0", "npz")
        session.run(manager.init(["trainer_0"]))
        session.run(manager.save(1))
        session.workspace("trainer_0")["w"][:] = 0
        session.run(manager.load(1))
        assert session.workspace("trainer_0")["w"].tolist() == [0.0, 1.0, 2.0]


@pytest.fixture
def started_mock() -> Iterator[None]:
    """moto's mock started and stopped by hand, as a fixture of the user's would."""
    mock = mock_aws()
    mock.start()
    yield
    mock.stop()


@pytest.mark.usefixtures("started_mock")
def test_a_mock_started_by_a_fixture_serves_the_test() -> None:
    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="fixture")
    save_tree("s3://fixture/run", 3, {"step": 3})
    assert load_tree("s3://fixture/run") == {"step": 3}


@mock_aws
def test_large_objects_go_up_in_parts_and_come_back_whole() -> None:
    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="big")
    options = {"multipart_threshold": 5 * MiB, "part_size": 5 * MiB}
    storage = S3Path("s3://big/run", **options)
    data = np.random.default_rng(0).bytes(12 * MiB)
    storage.write_bytes("trainer_0.1/blob", data)
    head = boto3.client("s3", region_name="us-east-1").head_object(
        Bucket="big", Key="run/trainer_0.1/blob"
    )
    assert head["ETag"].strip('"').endswith("-3")  # three parts: a multipart upload
    assert storage.read_bytes("trainer_0.1/blob") == data
    assert storage.read_bytes("trainer_0.1/blob", 7 * MiB, 10) == data[7 * MiB : 7 * MiB + 10]
    with storage.open_write("trainer_0.1/streamed") as stream:  # a write stream, in parts
        for start in range(0, len(data), MiB):
            stream.write(data[start : start + MiB])
    assert storage.read_bytes("trainer_0.1/streamed") == data


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_a_job_saves_and_resumes_with_the_io_engines_threads(async_save: bool) -> None:
    from ckpt_helpers import build_counter_job

    with mock_aws():
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="runs")
        job, _ = build_counter_job(epochs=3)
        manager = MultiNodeCheckpointManager("s3://runs/job", "npz", metadata_handler="json")
        runner = JobRunner(job, manager, async_save=async_save)
        assert runner.train(LocalSession()) == 3
        assert runner.committed_epochs == [0, 1, 2, 3]
        again = JobRunner(job, MultiNodeCheckpointManager("s3://runs/job", "npz", "json"))
        assert again.train(LocalSession()) == 3
        assert again.already_finished  # found epoch 3 in the mock's bucket
        assert "job/_ckptstore/epoch-3/trainer_0.commit.json" in keys("runs")


@mock_aws
def test_threads_saving_at_once_share_one_server_and_one_backend(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ckptstore_s3 import moto_mock

    starts: list[str] = []
    start = moto_mock._start

    def counted() -> str:
        starts.append(threading.current_thread().name)
        return start()

    monkeypatch.setattr(moto_mock, "_server", None)  # no server yet, as in a new process
    monkeypatch.setattr(moto_mock, "_start", counted)
    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="many")

    def save_and_load(index: int) -> object:
        save_tree(f"s3://many/run-{index}", index, {"i": index, "w": np.full(100, index)})
        return load_tree(f"s3://many/run-{index}")

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        loaded = list(pool.map(save_and_load, range(6)))
    assert [tree["i"] for tree in loaded] == list(range(6))  # type: ignore[index]
    assert len(starts) == 1  # started once, by whichever request came first
    assert {key.split("/")[0] for key in keys("many")} == {f"run-{i}" for i in range(6)}


def test_the_cli_in_process_lists_and_verifies_the_mocks_checkpoints(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with mock_aws():
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="cli")
        save_tree("s3://cli/run", 2, {"step": 2})
        capsys.readouterr()
        assert main(["ls", "s3://cli/run"]) == 0
        assert re.search(r"^\s*2\b", capsys.readouterr().out, re.M)
        assert main(["verify", "s3://cli/run", "--latest"]) == 0


def test_each_mock_has_its_own_buckets_and_the_server_is_reused() -> None:
    from ckptstore_s3 import moto_mock

    endpoints = []
    for round_ in range(2):
        with mock_aws():
            s3 = boto3.client("s3", region_name="us-east-1")
            assert s3.list_buckets()["Buckets"] == []  # the last mock's bucket is gone
            s3.create_bucket(Bucket="bucket")
            manager = CheckpointManager("s3://bucket/run", "trainer_0", "npz")
            save_tree(manager, round_, {"round": round_})
            assert load_tree(manager) == {"round": round_}
            endpoints.append(moto_mock.server_endpoint())
    assert endpoints[0] == endpoints[1]


def test_a_path_made_before_the_mock_started_follows_it() -> None:
    storage = S3Path("s3://early/run")
    with mock_aws():
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="early")
        storage.write_bytes("a", b"made before the mock")
        assert keys("early") == ["run/a"]


def test_a_bucket_in_another_region_is_shared_too() -> None:
    with mock_aws():
        boto3.client("s3", region_name="eu-west-1").create_bucket(
            Bucket="european", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"}
        )
        save_tree("s3://european/run", 1, {"ok": True})
        assert load_tree("s3://european/run") == {"ok": True}


@mock_aws
def test_a_missing_bucket_is_reported_as_missing_in_the_mock() -> None:
    with pytest.raises(StorageError, match="the bucket does not exist at moto's mock_aws"):
        S3Path("s3://never-created/run").write_bytes("a", b"x")


def test_an_explicit_endpoint_is_left_alone_inside_the_mock(
    s3_faults: FaultProxy, s3_storage_options: dict[str, object]
) -> None:
    """A test's own S3 server is not rerouted: mock_aws does not intercept it."""
    with mock_aws():
        storage = S3Path("s3://real-server/run", **s3_storage_options)
        boto3.client(
            "s3",
            region_name="us-east-1",
            endpoint_url=str(s3_storage_options["endpoint_url"]),
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        ).create_bucket(Bucket="real-server")
        storage.write_bytes("a", b"to the real server")
        assert s3_faults.count("PUT") >= 1  # it went through the test's server
        assert boto3.client("s3", region_name="us-east-1").list_buckets()["Buckets"] == []


def test_in_process_moto_inside_the_mock_still_works() -> None:
    with mock_aws():
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="bucket")
        with in_process_moto() as server:
            storage = S3Path("s3://bucket/run")
            assert storage.options.endpoint_url == server.endpoint_url
            storage.write_bytes("a", b"x")
        assert "AWS_ENDPOINT_URL_S3" not in os.environ  # restored on exit
        assert keys("bucket") == ["run/a"]


def test_the_fixture_runs_a_job_that_resumes(s3_mock_aws: InProcessMoto) -> None:
    from ckpt_helpers import build_counter_job

    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="runs")
    job, _ = build_counter_job(epochs=2)
    manager = MultiNodeCheckpointManager("s3://runs/job", "npz", metadata_handler="json")
    assert JobRunner(job, manager).train(LocalSession()) == 2
    again = JobRunner(job, MultiNodeCheckpointManager("s3://runs/job", "npz", "json"))
    assert again.train(LocalSession()) == 2
    assert again.already_finished
    assert "job/_ckptstore/epoch-2/trainer_0.commit.json" in keys("runs")


def test_an_intercepted_endpoint_the_plugin_does_not_know_is_refused_with_a_typed_error() -> None:
    with mock_aws():
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="bucket")
        storage = S3Path("s3://bucket/run", endpoint_url=ISO_ENDPOINT, region="us-iso-east-1")
        with pytest.raises(InProcessMockError) as caught:
            storage.write_bytes("trainer_0.1/w", b"x")
    message = str(caught.value)
    assert "s3://bucket/run/trainer_0.1/w" in message  # the request that was intercepted
    assert "in_process_moto()" in message
    assert "nothing is wrong with the location or the credentials" in message
    assert isinstance(caught.value, TypeError)
    assert "await" in str(caught.value.__cause__)  # aiobotocore's own error, kept as cause


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_a_job_on_a_refused_endpoint_stops_at_once_unretried(
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
        manager = MultiNodeCheckpointManager(
            "s3://bucket/job", "npz", storage_options={"endpoint_url": ISO_ENDPOINT}
        )
        runner = JobRunner(job, manager, save_retries=3, async_save=async_save)
        with pytest.raises(InProcessMockError):
            runner.train(LocalSession())
    assert len(refused) == 1, refused  # one request: neither the client nor the runner retried
    assert runner.save_failures == []  # not counted as a failed save: raised at once
    assert runner.committed_epochs == []


def test_gcs_checkpoints_are_untouched_by_the_mock(gcs_url: str) -> None:
    with mock_aws():
        save_tree(gcs_url, 1, {"on": "gcs"})
        assert load_tree(gcs_url) == {"on": "gcs"}


# -- outside pytest ---------------------------------------------------------------------

SCRIPT = """
import boto3
import numpy as np
from moto import mock_aws

from ckptstore.tree import load_tree, save_tree

with mock_aws():
    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="scripted")
    save_tree("s3://scripted/run", 1, {"w": np.ones(3), "step": 1})
    print("context manager:", load_tree("s3://scripted/run")["step"])


@mock_aws
def decorated():
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="decorated")
    save_tree("s3://decorated/run", 2, {"step": 2})
    listed = s3.list_objects_v2(Bucket="decorated")["Contents"]
    print("decorator:", load_tree("s3://decorated/run")["step"], len(listed))


decorated()
"""


def run_python(*arguments: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """This interpreter run with ``arguments``, as a user would, without the test
    process's AWS environment."""
    return subprocess.run(
        [sys.executable, *arguments],
        cwd=cwd,
        env={k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_a_plain_script_runs_quietly_and_exits(tmp_path: Path) -> None:
    (tmp_path / "script.py").write_text(textwrap.dedent(SCRIPT))
    result = run_python("script.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["context manager: 1", "decorator: 2 3"]
    assert result.stderr == ""  # no access log of moto's server, no warning


def test_the_documented_example_passes_as_users_run_it(tmp_path: Path) -> None:
    text = (Path(__file__).resolve().parents[3] / "docs" / "testing.md").read_text()
    blocks = re.findall(r"```python\n(# test_with_mock_aws\.py\n.*?)```", text, re.S)
    assert len(blocks) == 1, "docs/testing.md lost its mock_aws example"
    assert "in_process_moto" not in blocks[0]  # plain mock_aws, nothing else
    (tmp_path / "test_with_mock_aws.py").write_text(blocks[0])
    assert "Run it with `pytest test_with_mock_aws.py`" in text
    result = run_python(
        "-m", "pytest", "-p", "no:cacheprovider", "-q", "test_with_mock_aws.py", cwd=tmp_path
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed" in result.stdout


def test_without_moto_server_the_error_says_what_to_install() -> None:
    """moto without its server extra (flask made unimportable here, as if missing)."""
    script = textwrap.dedent(
        """
        import sys
        sys.modules["flask"] = None  # as if moto[server] were not installed
        import boto3
        from moto import mock_aws
        from ckptstore.errors import InProcessMockError
        from ckptstore.tree import save_tree

        with mock_aws():
            boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="bucket")
            try:
                save_tree("s3://bucket/run", 1, {"step": 1})
            except InProcessMockError as error:
                print(error)
        """
    )
    result = run_python("-W", "ignore", "-c", script)
    assert result.returncode == 0, result.stderr
    assert "pip install 'moto[server]'" in result.stdout
    assert "s3://bucket/run/" in result.stdout
