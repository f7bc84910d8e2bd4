"""How S3 failures are judged: which are worth another attempt, which mean a missing
object or a range past its end, and what to tell the user.

Throttling (503 ``SlowDown``, 429), server errors (5xx), request timeouts, dropped or
refused connections and truncated bodies are retried; anything else (404, 403, a bad
request) fails at once. botocore's own retries are switched off
(:meth:`~ckptstore_s3.options.S3Options.s3fs_kwargs`), so the policy of
:mod:`ckptstore.object_store._retry` is the only one.

Example::

    >>> import botocore.exceptions
    >>> S3ErrorRules().classify(botocore.exceptions.ConnectTimeoutError(endpoint_url="x")).retryable
    True
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from ckptstore.object_store import ErrorRules, Failure

__all__ = ["RETRYABLE_CODES", "S3ErrorRules"]

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
_MISSING_OBJECT_CODES = frozenset({"NoSuchKey", "404", "NoSuchUpload"})


@functools.cache
def _client_errors() -> tuple[type[BaseException], tuple[type[BaseException], ...]]:
    """botocore's ``ClientError`` (an answer from S3) and the exceptions of a request
    that got no answer and may be retried. Imported on the first failure, not with the
    plugin: aiohttp takes about 0.2 s to import, and every process that builds
    ckptstore's plugin registry imports this module, whether it uses S3 or not."""
    import aiohttp
    import botocore.exceptions

    transient = (
        botocore.exceptions.HTTPClientError,  # connection closed, read timeouts
        botocore.exceptions.ConnectionError,  # could not connect, connect timeouts
        botocore.exceptions.ResponseStreamingError,
        botocore.exceptions.IncompleteReadError,
        aiohttp.ClientError,
        asyncio.TimeoutError,
        ConnectionError,
    )
    return botocore.exceptions.ClientError, transient


class S3ErrorRules(ErrorRules):
    """botocore's and aiohttp's exceptions, judged for the retry loop.

    Example::

        >>> from ckptstore.object_store import Failure
        >>> S3ErrorRules().is_throttling(Failure(True, 503, "SlowDown"))
        True
    """

    endpoint_settings = "endpoint_url, AWS_ENDPOINT_URL_S3"
    credential_settings = (
        "AWS_PROFILE / AWS_ACCESS_KEY_ID or the key/secret/profile storage options and the "
        "bucket policy"
    )
    throttling_codes = _THROTTLING_CODES
    missing_bucket_codes = frozenset({"NoSuchBucket"})
    missing_object_code = "NoSuchKey"

    def classify(self, error: BaseException) -> Failure:
        answered, transient = _client_errors()
        if isinstance(error, answered):
            response: dict[str, Any] = getattr(error, "response", None) or {}
            code = str(response.get("Error", {}).get("Code") or "") or None
            raw_status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            status = int(raw_status) if raw_status is not None else None
            retryable = (code in RETRYABLE_CODES) or (
                status is not None and (status >= 500 or status == 429)
            )
            return Failure(retryable, status, code, _summary(response, status, code))
        return Failure(isinstance(error, transient))

    def is_missing(self, failure: Failure) -> bool:
        return failure.status == 404 and failure.code in _MISSING_OBJECT_CODES

    def is_past_end(self, failure: Failure) -> bool:
        return failure.code == "InvalidRange"


def _summary(response: dict[str, Any], status: int | None, code: str | None) -> str | None:
    """``"HTTP 503 SlowDown (Please reduce your request rate.)"``; ``None`` for an
    answer with neither status nor code."""
    if status is None and code is None:
        return None
    message = str(response.get("Error", {}).get("Message") or "")
    head = " ".join(part for part in (f"HTTP {status}" if status else "", code or "") if part)
    return f"{head} ({message})" if message else head
