"""Retrying GCS requests: which failures are worth another attempt, and how long to wait.

HTTP 408, 429 and 5xx answers, timeouts and dropped or refused connections are retried
with exponential backoff and jitter; anything else (404, 403, a bad request) fails at
once. Each attempt is one request, so the policy here is the only one.

Example::

    policy = RetryPolicy(attempts=5, base_delay=0.05)
    await call_with_retries(send, policy, describe="GET gs://b/k", endpoint=url)
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

import aiohttp

__all__ = ["HttpStatusError", "RequestError", "RetryPolicy", "call_with_retries", "mask"]

T = TypeVar("T")
RETRYABLE_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
MIN_SECRET_LENGTH = 4
_TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
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


class HttpStatusError(Exception):
    """A GCS answer with an error status (raised inside an attempt).

    Example::

        raise HttpStatusError(503, "backendError: Backend Error")
    """

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"HTTP {status} {reason}".strip())
        self.status = status
        self.reason = reason


class RequestError(OSError):
    """A GCS request that failed for good, described without credentials.

    Example::

        except StorageError as err:
            err.__cause__.status  # 503, after the retries ran out
    """

    def __init__(self, message: str, *, status: int | None, attempts: int, retryable: bool) -> None:
        super().__init__(message)
        self.status = status
        self.attempts = attempts
        self.retryable = retryable

    def __str__(self) -> str:
        return str(self.args[0])


class MissingObjectError(RequestError, FileNotFoundError):
    """The object does not exist (HTTP 404).

    Example::

        except MissingObjectError: return None
    """


def mask(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every credential value of ``secrets`` replaced by ``***``."""
    for secret in sorted(secrets, key=len, reverse=True):
        if len(secret) >= MIN_SECRET_LENGTH:
            text = text.replace(secret, "***")
    return text


def classify(error: BaseException) -> tuple[bool, int | None]:
    """``(retryable, HTTP status)`` of a failed request."""
    if isinstance(error, HttpStatusError):
        return error.status in RETRYABLE_STATUSES, error.status
    return isinstance(error, _TRANSIENT_ERRORS), None


async def call_with_retries(
    operation: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    *,
    describe: str,
    endpoint: str,
    secrets: Iterable[str] = (),
) -> T:
    """Await ``operation()`` until it succeeds, a non-transient error occurs or the
    attempts run out; failures become :class:`RequestError` (404:
    :class:`MissingObjectError`), with credentials masked."""
    started = time.monotonic()
    for attempt in range(1, policy.attempts + 1):
        try:
            return await operation()
        except Exception as error:
            retryable, status = classify(error)
            if retryable and attempt < policy.attempts:
                await asyncio.sleep(policy.backoff(attempt))
                continue
            elapsed = time.monotonic() - started
            summary = str(error) if status is not None else f"{type(error).__name__}: {error}"
            if retryable and status in (429, 503):
                hint = (
                    f"the endpoint {endpoint} kept throttling after {attempt} attempts over "
                    f"{elapsed:.1f} s; lower the request rate (storage option "
                    "max_concurrency, CKPTSTORE_IO_CONCURRENCY) or raise the storage "
                    "option retries"
                )
            elif retryable:
                hint = (
                    f"the endpoint {endpoint} kept failing after {attempt} attempts over "
                    f"{elapsed:.1f} s; check that it is up and reachable from this machine "
                    "(endpoint_url, STORAGE_EMULATOR_HOST) or raise the storage option "
                    "retries"
                )
            elif status in (401, 403):
                hint = (
                    f"the endpoint {endpoint} refused the credentials; check "
                    "GOOGLE_APPLICATION_CREDENTIALS or the token storage option and the "
                    "bucket's IAM policy"
                )
            else:
                hint = f"endpoint {endpoint}"
            message = mask(f"{describe} failed: {summary}; {hint}", secrets)
            kind = MissingObjectError if status == 404 else RequestError
            raise kind(message, status=status, attempts=attempt, retryable=retryable) from None
    raise AssertionError("unreachable: the loop returns or raises")  # pragma: no cover
