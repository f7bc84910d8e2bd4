"""Retrying object-store requests: one policy and one loop for every backend.

Each attempt is one request. A failure the backend's :class:`ErrorRules` calls
retryable (throttling, 5xx, resets, timeouts) is tried again after an exponential
backoff with jitter, until the policy's attempts run out; anything else fails at once.
The last failure becomes a :class:`~ckptstore.object_store._failures.RequestError` that
says what to check. Once a request has been retried for :data:`QUIET_RETRY_SECONDS`, each
further retry is logged as a warning (which request, the failure, how long so far, when
the next attempt comes), so a user waiting on an unreachable endpoint sees why.

Example::

    >>> import asyncio
    >>> from ckptstore.object_store import ErrorRules, Failure
    >>> class Rules(ErrorRules):
    ...     endpoint_settings = credential_settings = "..."
    ...     def classify(self, error):
    ...         return Failure(isinstance(error, ConnectionError))
    >>> attempts = []
    >>> async def send():
    ...     attempts.append(1)
    ...     if len(attempts) < 3:
    ...         raise ConnectionResetError()
    ...     return "stored"
    >>> policy = RetryPolicy(attempts=5, base_delay=0.001)
    >>> asyncio.run(call_with_retries(send, policy, Rules(), describe="PUT s3://b/k",
    ...                               endpoint="http://127.0.0.1:9000"))
    'stored'
    >>> len(attempts)
    3
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from ckptstore.errors import CorruptCheckpointError, InProcessMockError
from ckptstore.object_store._failures import ErrorRules, describe_exception, request_error
from ckptstore.object_store._masking import mask

__all__ = ["QUIET_RETRY_SECONDS", "RetryPolicy", "call_with_retries"]

log = logging.getLogger(__name__)

QUIET_RETRY_SECONDS = 2.0
"""Retries of one request stay silent this long; after it, each retry is logged (a
warning: the CLI shows it on stderr), since a user is then waiting on something."""

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a request is retried.

    ``attempts`` counts the first try; the wait before retry ``n`` (from 1) is drawn
    between half and all of ``min(max_delay, base_delay * 2**(n-1))``.

    Example::

        >>> 0.1 <= RetryPolicy(attempts=8, base_delay=0.1, max_delay=5.0).backoff(3) <= 0.4
        True
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


async def call_with_retries(
    operation: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    rules: ErrorRules,
    *,
    describe: str,
    endpoint: str,
    secrets: Iterable[str] = (),
    on_retry: Callable[[int, BaseException], None] | None = None,
) -> T:
    """Await ``operation()`` until it succeeds, a failure ``rules`` does not call
    retryable occurs or the policy's attempts run out; the last failure becomes a
    :class:`~ckptstore.object_store._failures.RequestError` (with credentials masked).
    ``on_retry(attempt, error)`` hears about every failure that is retried."""
    started = time.monotonic()
    attempt = 1
    while True:
        try:
            return await operation()
        except (InProcessMockError, CorruptCheckpointError):
            # a test set-up that cannot work, or stored bytes refused (an oversized
            # document): no retry, no request error
            raise
        except Exception as error:
            if rules.judge(error).retryable and attempt < policy.attempts:
                if on_retry is not None:
                    on_retry(attempt, error)
                delay = policy.backoff(attempt)
                elapsed = time.monotonic() - started
                if elapsed >= QUIET_RETRY_SECONDS:
                    _log_waiting(
                        rules, error, elapsed, attempt + 1, policy, delay, describe, secrets
                    )
                await asyncio.sleep(delay)
                attempt += 1
                continue
            raise request_error(
                rules,
                error,
                describe=describe,
                endpoint=endpoint,
                attempts=attempt,
                elapsed=time.monotonic() - started,
                secrets=secrets,
            ) from None


def _log_waiting(
    rules: ErrorRules,
    error: BaseException,
    elapsed: float,
    attempt: int,
    policy: RetryPolicy,
    delay: float,
    describe: str,
    secrets: Iterable[str],
) -> None:
    summary = rules.judge(error).summary or describe_exception(error)
    log.warning(
        "%s",
        mask(
            f"Still retrying {describe} after {elapsed:.1f} s: {summary}; "
            f"attempt {attempt} of {policy.attempts} in {delay:.1f} s",
            secrets,
        ),
    )
