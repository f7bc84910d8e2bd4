"""What a failed object-store request means, and how it is reported.

A backend judges its own errors through :class:`ErrorRules` (the only part that knows
botocore's or aiohttp's exceptions): is the failure worth another attempt, what HTTP
status and error code it carries, whether it says the object is missing or the range
starts past its end. :func:`request_error` then turns the last failure into a
:class:`RequestError` whose message says what failed and what to check, with
credentials masked.

Example::

    >>> class MyHttpError(Exception):
    ...     def __init__(self, status):
    ...         self.status = status
    >>> class MyRules(ErrorRules):
    ...     endpoint_settings = "endpoint_url, MY_ENDPOINT"
    ...     credential_settings = "MY_TOKEN or the token storage option"
    ...
    ...     def classify(self, error):
    ...         if isinstance(error, MyHttpError):
    ...             return Failure(error.status >= 500, error.status, summary=str(error))
    ...         return Failure(isinstance(error, ConnectionError))
    >>> MyRules().classify(MyHttpError(503)).retryable
    True
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import ClassVar

from ckptstore.errors import (
    CREDENTIAL_STATUSES,
    MissingObjectError,
    RangeNotSatisfiableError,
    RequestError,
)
from ckptstore.object_store._masking import mask

__all__ = [
    "ErrorRules",
    "Failure",
    "MissingObjectError",
    "RangeNotSatisfiableError",
    "RequestError",
    "request_error",
]

THROTTLING_STATUSES = frozenset({429, 503})


@dataclass(frozen=True)
class Failure:
    """One failed request as its backend sees it.

    ``summary`` describes the answer (``"HTTP 503 SlowDown (Please reduce...)"``);
    ``None`` describes the exception itself (``"ConnectionResetError: ..."``).

    Example::

        >>> Failure(retryable=True, status=503, code="SlowDown", summary="HTTP 503 SlowDown")
        Failure(retryable=True, status=503, code='SlowDown', summary='HTTP 503 SlowDown')
    """

    retryable: bool
    status: int | None = None
    code: str | None = None
    summary: str | None = None


class ErrorRules(ABC):
    """How one backend's failures are judged and explained (the retry loop's hook).

    Class attributes name what a user can change: ``endpoint_settings`` (where the
    endpoint is set), ``credential_settings`` (where credentials come from); error codes
    in ``throttling_codes`` mean "slow down", those in ``missing_bucket_codes`` that the
    bucket does not exist; ``missing_object_code`` is the code of a missing object.

    Example::

        >>> class Rules(ErrorRules):
        ...     endpoint_settings = credential_settings = "..."
        ...     def classify(self, error):
        ...         return Failure(isinstance(error, ConnectionError))
        >>> rules = Rules()
        >>> rules.classify(ConnectionResetError())
        Failure(retryable=True, status=None, code=None, summary=None)
    """

    endpoint_settings: ClassVar[str]
    credential_settings: ClassVar[str]
    throttling_codes: ClassVar[frozenset[str]] = frozenset()
    missing_bucket_codes: ClassVar[frozenset[str]] = frozenset()
    missing_object_code: ClassVar[str | None] = None

    @abstractmethod
    def classify(self, error: BaseException) -> Failure:
        """What ``error`` (raised by one attempt) means."""

    def judge(self, error: BaseException) -> Failure:
        """:meth:`classify`, except that an answer about credentials (HTTP 401/403) is
        never retried, whatever code a store sends with it (the retry loop's question).

        Example::

            >>> class Lenient(ErrorRules):
            ...     def classify(self, error):
            ...         return Failure(True, status=403, code="SlowDown")
            >>> Lenient().judge(RuntimeError()).retryable
            False
        """
        failure = self.classify(error)
        if failure.retryable and failure.status in CREDENTIAL_STATUSES:
            return replace(failure, retryable=False)
        return failure

    def is_missing(self, failure: Failure) -> bool:
        """Whether the failure says the object does not exist (HTTP 404 by default)."""
        return failure.status == 404

    def is_past_end(self, failure: Failure) -> bool:
        """Whether a ranged read started past the object's end (HTTP 416 by default)."""
        return failure.status == 416

    def is_throttling(self, failure: Failure) -> bool:
        """Whether a retryable failure asked the client to slow down."""
        return failure.retryable and (
            failure.status in THROTTLING_STATUSES or failure.code in self.throttling_codes
        )


def describe_exception(error: BaseException) -> str:
    """``"TypeName: message"`` (the type name again when the message is empty)."""
    name = type(error).__name__
    return f"{name}: {str(error) or name}"


def request_error(
    rules: ErrorRules,
    error: BaseException,
    *,
    describe: str,
    endpoint: str,
    attempts: int,
    elapsed: float,
    secrets: Iterable[str] = (),
) -> RequestError:
    """The error to raise for ``error``, the last failure of ``describe`` (``"PUT
    s3://b/k"``) after ``attempts`` attempts over ``elapsed`` seconds."""
    failure = rules.judge(error)
    summary = failure.summary or describe_exception(error)
    message = mask(
        f"{describe} failed: {summary}; {_hint(rules, failure, endpoint, attempts, elapsed)}",
        secrets,
    )
    kind = (
        MissingObjectError
        if rules.is_missing(failure)
        else RangeNotSatisfiableError
        if rules.is_past_end(failure)
        else RequestError
    )
    return kind(
        message,
        status=failure.status,
        code=failure.code,
        attempts=attempts,
        retryable=failure.retryable,
    )


def _hint(rules: ErrorRules, failure: Failure, endpoint: str, attempts: int, elapsed: float) -> str:
    """What to check or change, for the user."""
    if rules.is_throttling(failure):
        return (
            f"the endpoint {endpoint} kept throttling after {attempts} attempts over "
            f"{elapsed:.1f} s; lower the request rate (storage option max_concurrency, "
            "CKPTSTORE_IO_CONCURRENCY) or raise the storage option retries"
        )
    if failure.retryable:
        return (
            f"the endpoint {endpoint} kept failing after {attempts} attempts over "
            f"{elapsed:.1f} s; check that it is up and reachable from this machine "
            f"({rules.endpoint_settings}) or raise the storage option retries"
        )
    if failure.status in CREDENTIAL_STATUSES:
        return f"the endpoint {endpoint} refused the credentials; check {rules.credential_settings}"
    if failure.code in rules.missing_bucket_codes:
        return f"the bucket does not exist at {endpoint}; create it or fix the URL"
    return f"endpoint {endpoint}"
