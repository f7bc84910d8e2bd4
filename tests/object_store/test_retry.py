"""One retry loop for every backend: transient failures are retried with backoff until
the attempts run out, anything else fails at once."""

from __future__ import annotations

import asyncio
import logging
import re

import pytest
from object_store_fakes import FakeHttpError, FakeRules

from ckptstore.object_store._failures import Failure, RequestError
from ckptstore.object_store._retry import QUIET_RETRY_SECONDS, RetryPolicy, call_with_retries
from ckptstore.testing.servers import free_port

QUICK = RetryPolicy(attempts=3, base_delay=0.0, max_delay=0.0)


class Flaky:
    """Fails with ``errors`` in turn, then answers ``"done"``.

    Example::

        run(Flaky(ConnectionResetError()))  # 'done', on the second call
    """

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "done"


def run(operation: Flaky, policy: RetryPolicy = QUICK, **options: object) -> str:
    return asyncio.run(
        call_with_retries(
            operation, policy, FakeRules(), describe="GET mem://b/k", endpoint="memory", **options
        )
    )


def test_transient_failures_are_retried_until_one_succeeds() -> None:
    operation = Flaky(ConnectionResetError(), FakeHttpError(503))
    retried: list[int] = []
    assert run(operation, on_retry=lambda attempt, error: retried.append(attempt)) == "done"
    assert operation.calls == 3
    assert retried == [1, 2]


def test_a_permanent_failure_is_not_retried() -> None:
    operation = Flaky(FakeHttpError(403))
    with pytest.raises(RequestError) as caught:
        run(operation)
    assert operation.calls == 1
    assert (caught.value.status, caught.value.attempts, caught.value.retryable) == (403, 1, False)


class EverythingRetryable(FakeRules):
    """A backend's rules that would retry any answer, 401 and 403 included."""

    def classify(self, error: BaseException) -> Failure:
        failure = super().classify(error)
        return Failure(True, failure.status, failure.code, failure.summary)


@pytest.mark.parametrize("status", [401, 403])
def test_an_answer_about_credentials_is_final_whatever_a_backend_says(status: int) -> None:
    operation = Flaky(FakeHttpError(status), FakeHttpError(status))
    with pytest.raises(RequestError, match="refused the credentials") as caught:
        asyncio.run(
            call_with_retries(
                operation, QUICK, EverythingRetryable(), describe="PUT mem://b/k", endpoint="memory"
            )
        )
    assert operation.calls == 1
    assert (caught.value.status, caught.value.retryable) == (status, False)


def test_the_last_failure_is_raised_when_the_attempts_run_out() -> None:
    operation = Flaky(*[FakeHttpError(503)] * 5)
    with pytest.raises(RequestError, match="after 3 attempts") as caught:
        run(operation)
    assert operation.calls == 3
    assert caught.value.retryable


def test_backoff_grows_exponentially_with_jitter_up_to_the_maximum() -> None:
    policy = RetryPolicy(attempts=8, base_delay=0.1, max_delay=1.0)
    for retry in range(1, 9):
        ceiling = min(1.0, 0.1 * 2 ** (retry - 1))
        for _ in range(20):
            assert ceiling / 2 <= policy.backoff(retry) <= ceiling


@pytest.mark.parametrize(
    ("settings", "message"),
    [({"attempts": 0}, "attempts must be at least 1"), ({"base_delay": -1}, "not be negative")],
)
def test_bad_policies_are_refused(settings: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RetryPolicy(**settings)  # type: ignore[arg-type]


def test_a_request_retried_for_two_seconds_says_what_it_waits_for(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An unreachable endpoint (a closed port on 127.0.0.1): silent for the first two
    seconds of retries, then each retry logs the request, the failure, the time so far
    and the next attempt."""
    port = free_port()

    async def connect() -> str:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.close()
        return "connected"

    policy = RetryPolicy(attempts=14, base_delay=0.4, max_delay=0.4)  # 2.6-5.2 s in all
    with (
        caplog.at_level(logging.WARNING, logger="ckptstore.object_store._retry"),
        pytest.raises(RequestError, match="after 14 attempts"),
    ):
        asyncio.run(
            call_with_retries(
                connect,
                policy,
                FakeRules(),
                describe=f"GET http://127.0.0.1:{port}/k",
                endpoint=f"http://127.0.0.1:{port}",
            )
        )
    lines = [record.getMessage() for record in caplog.records]
    assert lines, "no retry was reported"
    assert len(lines) < 13  # the retries of the first two seconds are silent
    first = re.fullmatch(
        rf"Still retrying GET http://127\.0\.0\.1:{port}/k after (\d+\.\d) s: "
        r"ConnectionRefusedError: .*; attempt (\d+) of 14 in 0\.\d s",
        lines[0],
    )
    assert first is not None, lines[0]
    assert float(first[1]) >= QUIET_RETRY_SECONDS
    assert int(first[2]) == 14 - len(lines) + 1  # one line per retry from then on
    assert all(record.levelno == logging.WARNING for record in caplog.records)
