"""Retrying S3 requests: which failures are worth another attempt, and how long to wait.

Throttling (503 ``SlowDown``, 429), server errors (5xx), request timeouts, dropped or
refused connections and truncated bodies are retried with exponential backoff and
jitter; anything else (404, 403, a bad request) fails at once. Each attempt is one
request: botocore's own retries are switched off, so the policy here is the only one.

Example::

    policy = RetryPolicy(attempts=5, base_delay=0.05)
    await call_with_retries(lambda: client.put_object(...), policy, describe="PUT a/b")
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
import botocore.exceptions

__all__ = [
    "RETRYABLE_CODES",
    "RequestError",
    "RetryPolicy",
    "call_with_retries",
    "classify",
    "mask",
]

T = TypeVar("T")

RETRYABLE_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "TooManyRequests",
        "TooManyRequestsException",
        "RequestTimeout",
        "RequestTimeoutException",
        "InternalError",
        "ServiceUnavailable",
        "ServiceUnavailableException",
        "BadGateway",
        "GatewayTimeout",
        "IncompleteBody",
        "500",
        "502",
        "503",
        "504",
    }
)
"""S3 error codes that mean "try again later"."""

_THROTTLING_CODES = frozenset(
    {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequests"}
)
_TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    botocore.exceptions.HTTPClientError,  # connection closed, read timeouts
    botocore.exceptions.ConnectionError,  # could not connect, connect timeouts
    botocore.exceptions.ResponseStreamingError,
    botocore.exceptions.IncompleteReadError,
    aiohttp.ClientError,
    asyncio.TimeoutError,
    ConnectionError,
)


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a request is retried.

    ``attempts`` counts the first try; the wait before retry ``n`` (from 1) is drawn
    between half and all of ``min(max_delay, base_delay * 2**(n-1))``.

    Example::

        RetryPolicy(attempts=8, base_delay=0.1, max_delay=5.0).backoff(3)  # 0.2-0.4 s
    """

    attempts: int = 8
    base_delay: float = 0.1
    max_delay: float = 5.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"retries: attempts must be at least 1, got {self.attempts}")
        if self.base_delay < 0 or self.max_delay < 0:
            raise ValueError("retries: delays must not be negative")

    def backoff(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (1 for the first retry)."""
        ceiling = min(self.max_delay, self.base_delay * 2.0 ** (retry - 1))
        return ceiling / 2 + random.uniform(0, ceiling / 2)


class RequestError(OSError):
    """An S3 request that failed for good, described without credentials.

    ``status`` is the HTTP status (``None`` if no answer came), ``code`` the S3 error
    code, ``attempts`` how many requests were made, ``retryable`` whether the last
    failure was a transient one (the retries ran out).

    Example::

        except StorageError as err:
            cause = err.__cause__  # RequestError: HTTP 503 SlowDown ... after 8 attempts
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None,
        code: str | None,
        attempts: int,
        retryable: bool,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.attempts = attempts
        self.retryable = retryable

    def __str__(self) -> str:
        return str(self.args[0])


MIN_SECRET_LENGTH = 4
"""Shorter credential values are not masked (they would garble every message)."""


def mask(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every credential value of ``secrets`` replaced by ``***``."""
    for secret in sorted(secrets, key=len, reverse=True):
        if len(secret) >= MIN_SECRET_LENGTH:
            text = text.replace(secret, "***")
    return text


def classify(error: BaseException) -> tuple[bool, int | None, str | None]:
    """``(retryable, HTTP status, S3 error code)`` of a failed request."""
    if isinstance(error, botocore.exceptions.ClientError):
        response: dict[str, Any] = error.response or {}
        code = str(response.get("Error", {}).get("Code") or "") or None
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        status = int(status) if status is not None else None
        retryable = (code in RETRYABLE_CODES) or (
            status is not None and (status >= 500 or status == 429)
        )
        return retryable, status, code
    if isinstance(error, _TRANSIENT_ERRORS):
        return True, None, None
    return False, None, None


def _summary(error: BaseException, status: int | None, code: str | None) -> str:
    if status is not None or code is not None:
        message = ""
        if isinstance(error, botocore.exceptions.ClientError):
            message = str((error.response or {}).get("Error", {}).get("Message") or "")
        head = " ".join(part for part in (f"HTTP {status}" if status else "", code or "") if part)
        return f"{head} ({message})" if message else head
    text = str(error) or type(error).__name__
    return f"{type(error).__name__}: {text}"


async def call_with_retries(
    operation: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    *,
    describe: str,
    endpoint: str,
    secrets: Iterable[str] = (),
    on_retry: Callable[[int, BaseException], None] | None = None,
) -> T:
    """Await ``operation()`` until it succeeds, a non-transient error occurs or the
    policy's attempts run out; failures become :class:`RequestError` (secrets in the
    message are masked)."""
    started = time.monotonic()
    for attempt in range(1, policy.attempts + 1):
        try:
            return await operation()
        except Exception as error:
            retryable, _status, _code = classify(error)
            if retryable and attempt < policy.attempts:
                if on_retry is not None:
                    on_retry(attempt, error)
                await asyncio.sleep(policy.backoff(attempt))
                continue
            raise _request_error(
                error, describe, endpoint, attempt, time.monotonic() - started, secrets
            ) from None
    raise AssertionError("unreachable: the loop returns or raises")  # pragma: no cover


def _request_error(
    error: BaseException,
    describe: str,
    endpoint: str,
    attempts: int,
    elapsed: float,
    secrets: Iterable[str],
) -> RequestError:
    retryable, status, code = classify(error)
    summary = _summary(error, status, code)
    if retryable and (status in (429, 503) or code in _THROTTLING_CODES):
        hint = (
            f"the endpoint {endpoint} kept throttling after {attempts} attempts over "
            f"{elapsed:.1f} s; lower the request rate (storage option max_concurrency, "
            "CKPTSTORE_IO_CONCURRENCY) or raise the storage option retries"
        )
    elif retryable:
        hint = (
            f"the endpoint {endpoint} kept failing after {attempts} attempts over "
            f"{elapsed:.1f} s; check that it is up and reachable from this machine "
            "(endpoint_url, AWS_ENDPOINT_URL_S3) or raise the storage option retries"
        )
    elif status in (401, 403):
        hint = (
            f"the endpoint {endpoint} refused the credentials; check AWS_PROFILE / "
            "AWS_ACCESS_KEY_ID or the key/secret/profile storage options and the "
            "bucket policy"
        )
    elif code in ("NoSuchBucket",):
        hint = f"the bucket does not exist at {endpoint}; create it or fix the URL"
    else:
        hint = f"endpoint {endpoint}"
    message = f"{describe} failed: {summary}; {hint}"
    message = mask(message, secrets)
    return RequestError(message, status=status, code=code, attempts=attempts, retryable=retryable)
