"""Credentials never appear in errors, logs, reports or ``repr``, even when every
request fails."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import pytest

from ckptstore import JobRunner, LocalSession, MultiNodeCheckpointManager
from ckptstore.errors import CkptStoreError
from ckptstore.plugin import get_registry, hookimpl
from ckptstore.records import NodeStats
from ckptstore.testing import FaultProxy
from ckptstore.testing.conformance import counting_job

KEY_ID = "AKIAIOSFODNN7EXAMPLE"
SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
TOKEN = "FwoGZXIvYXdzEXAMPLESESSIONTOKENvalue"


class Reports:
    """A reporter plugin that keeps every report it hears."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    @hookimpl
    def ckptstore_report(self, action_name: str, stats: Mapping[str, NodeStats]) -> None:
        self.texts.append(f"{action_name} {stats!r}")


@pytest.mark.parametrize("status", [403, 503])
def test_no_credential_in_errors_logs_reports_or_repr(
    s3_url: str,
    s3_faults: FaultProxy,
    caplog: pytest.LogCaptureFixture,
    status: int,
) -> None:
    caplog.set_level(logging.DEBUG)
    reports = Reports()
    get_registry().register(reports, name="reports")
    options = {
        "endpoint_url": s3_faults.endpoint_url,
        "key": KEY_ID,
        "secret": SECRET,
        "token": TOKEN,
        "retries": 1,
        "retry_base_delay": 0.01,
    }
    manager = MultiNodeCheckpointManager(s3_url, "npz", storage_options=options)
    runner = JobRunner(counting_job(epochs=1), manager, save_retries=0, retry_backoff=0)
    s3_faults.fail_next(10_000, status=status)
    with pytest.raises(CkptStoreError) as info:  # storage refusing every request stops it
        runner.train(LocalSession())

    texts = [
        caplog.text,
        repr(manager),
        repr(manager.location.storage),
        repr(manager.location),
        *reports.texts,
        str(info.value),
        repr(info.value.__cause__),
        *(str(failure.error) for failure in runner.save_failures),
    ]
    assert any(s3_url in text for text in texts)
    assert "Authorization" in caplog.text  # botocore's DEBUG output of the requests is there
    for text in texts:
        assert SECRET not in text
        assert TOKEN not in text
        assert KEY_ID not in text


def test_the_secret_is_masked_when_a_server_echoes_it(s3_url: str, s3_faults: FaultProxy) -> None:
    from ckptstore_s3 import S3Path
    from ckptstore_s3.options import S3Options

    storage = S3Path(s3_url, key=KEY_ID, secret=SECRET, retries=0)
    assert isinstance(storage.options, S3Options)
    assert storage.options.mask(f"bad signature for {SECRET} ({KEY_ID})") == (
        "bad signature for *** (***)"
    )
    assert SECRET not in repr(storage)
    assert KEY_ID not in repr(storage)
