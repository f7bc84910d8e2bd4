"""S3 storages share one botocore session per profile and ``AWS_*`` environment, so a
new storage's client skips loading the S3 service's model again."""

from __future__ import annotations

import pytest
from ckptstore_s3 import S3Path
from ckptstore_s3.sessions import shared_session


def test_storages_of_one_process_share_the_session_their_clients_come_from(s3_url: str) -> None:
    first, second = S3Path(s3_url), S3Path(s3_url)
    first.write_bytes("a", b"1")
    assert second.read_bytes("a") == b"1"
    assert first.fs is not second.fs  # a client each, one session
    assert first.fs.session is second.fs.session is shared_session(None)


def test_another_profile_or_aws_environment_gets_a_session_of_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    default = shared_session(None)
    assert shared_session("staging") is not default
    assert shared_session("staging") is shared_session("staging")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDROTATED")  # credentials changed
    assert shared_session(None) is not default
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    assert shared_session(None) is default
