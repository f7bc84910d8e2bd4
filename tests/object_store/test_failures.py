"""The last failure of a request becomes an error that says what failed, what to check
and of which kind it is (missing object, range past the end, anything else), with
credentials masked."""

from __future__ import annotations

import pytest
from object_store_fakes import FakeHttpError, FakeRules

from ckptstore.object_store._failures import (
    Failure,
    MissingObjectError,
    RangeNotSatisfiableError,
    RequestError,
    describe_exception,
    request_error,
)


def error_for(error: BaseException, *, attempts: int = 3) -> RequestError:
    return request_error(
        FakeRules(),
        error,
        describe="PUT mem://bucket/k",
        endpoint="http://fake:1",
        attempts=attempts,
        elapsed=1.25,
        secrets=["hunter2-token"],
    )


@pytest.mark.parametrize(
    ("error", "hint"),
    [
        (FakeHttpError(503), "the endpoint http://fake:1 kept throttling after 3 attempts over"),
        (FakeHttpError(500, "SlowDown"), "kept throttling"),
        (FakeHttpError(429), "lower the request rate (storage option max_concurrency, "),
        (FakeHttpError(500), "kept failing after 3 attempts over 1.2 s; check that it is up"),
        (
            ConnectionResetError("reset"),
            "reachable from this machine (endpoint_url, FAKE_ENDPOINT)",
        ),
        (FakeHttpError(403), "refused the credentials; check FAKE_TOKEN or the token storage"),
        (FakeHttpError(404, "NoSuchBucket"), "the bucket does not exist at http://fake:1; create"),
        (FakeHttpError(400, "BadRequest"), "failed: HTTP 400 BadRequest; endpoint http://fake:1"),
    ],
)
def test_the_message_says_what_to_check(error: BaseException, hint: str) -> None:
    message = str(error_for(error))
    assert message.startswith("PUT mem://bucket/k failed: ")
    assert hint in message


def test_the_kind_of_error_follows_the_rules() -> None:
    missing = error_for(FakeHttpError(404, "NoSuchKey"), attempts=1)
    assert isinstance(missing, MissingObjectError)
    assert isinstance(missing, FileNotFoundError)
    assert (missing.status, missing.code, missing.attempts, missing.retryable) == (
        404,
        "NoSuchKey",
        1,
        False,
    )
    assert isinstance(error_for(FakeHttpError(416, "InvalidRange")), RangeNotSatisfiableError)
    throttled = error_for(FakeHttpError(503), attempts=8)
    assert type(throttled) is RequestError
    assert (throttled.status, throttled.attempts, throttled.retryable) == (503, 8, True)


def test_credentials_are_masked_and_exceptions_described() -> None:
    message = str(error_for(PermissionError("bad token hunter2-token")))
    assert "hunter2-token" not in message
    assert "PermissionError: bad token ***" in message
    assert describe_exception(TimeoutError()) == "TimeoutError: TimeoutError"


def test_throttling_needs_a_retryable_failure() -> None:
    rules = FakeRules()
    assert rules.is_throttling(Failure(True, 503))
    assert rules.is_throttling(Failure(True, 500, "SlowDown"))
    assert not rules.is_throttling(Failure(False, 503))
    assert not rules.is_throttling(Failure(True, 500))
