"""How the S3 plugin judges botocore's errors for the retry loop."""

from __future__ import annotations

import botocore.exceptions
import pytest
from ckptstore_s3.errors import S3ErrorRules


def client_error(status: int, code: str) -> botocore.exceptions.ClientError:
    response = {
        "Error": {"Code": code, "Message": "m"},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    return botocore.exceptions.ClientError(response, "PutObject")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("status", "code", "retryable"),
    [
        (503, "SlowDown", True),
        (500, "InternalError", True),
        (400, "RequestTimeout", True),  # S3 sends this one with a 400
        (429, "TooManyRequests", True),
        (403, "AccessDenied", False),
        (404, "NoSuchKey", False),
        # an answer about credentials is final, whatever code an S3-compatible store
        # puts in it (one answering 401 "InternalError" was retried 8 times, 8 s)
        (401, "InternalError", False),
        (403, "SlowDown", False),
    ],
)
def test_only_transient_answers_are_retried(status: int, code: str, retryable: bool) -> None:
    failure = S3ErrorRules().judge(client_error(status, code))
    assert (failure.retryable, failure.status, failure.code) == (retryable, status, code)
