"""How GCS failures are judged: HTTP 408, 429 and 5xx answers, timeouts and dropped or
refused connections are worth another attempt; anything else (404, 403, a bad request)
fails at once. A 404 means a missing object, a 416 a range past its end (the defaults
of :class:`~ckptstore.object_store.ErrorRules`).

Example::

    >>> failure = GCSErrorRules().classify(HttpStatusError(503, "backendError: Backend Error"))
    >>> failure.retryable, failure.status
    (True, 503)
"""

from __future__ import annotations

import asyncio
import functools

from ckptstore.object_store import ErrorRules, Failure

__all__ = ["RETRYABLE_STATUSES", "GCSErrorRules", "HttpStatusError"]

RETRYABLE_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


@functools.cache
def _transient_errors() -> tuple[type[BaseException], ...]:
    """The exceptions of a request that got no answer and may be retried. aiohttp is
    imported on the first failure (the client imports it when it opens a session), not
    with the plugin: it takes about 0.2 s to import, and every process that builds
    ckptstore's plugin registry imports this module, whether it uses GCS or not."""
    import aiohttp

    return (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError)


class HttpStatusError(Exception):
    """A GCS answer with an error status (raised inside an attempt).

    Example::

        >>> str(HttpStatusError(503, "backendError: Backend Error"))
        'HTTP 503 backendError: Backend Error'
    """

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"HTTP {status} {reason}".strip())
        self.status = status
        self.reason = reason


class GCSErrorRules(ErrorRules):
    """GCS's answers and aiohttp's exceptions, judged for the retry loop.

    Example::

        >>> import aiohttp
        >>> GCSErrorRules().classify(aiohttp.ServerDisconnectedError()).retryable
        True
    """

    endpoint_settings = "endpoint_url, STORAGE_EMULATOR_HOST"
    credential_settings = (
        "GOOGLE_APPLICATION_CREDENTIALS or the token storage option and the bucket's IAM policy"
    )

    def classify(self, error: BaseException) -> Failure:
        if isinstance(error, HttpStatusError):
            return Failure(error.status in RETRYABLE_STATUSES, error.status, summary=str(error))
        return Failure(isinstance(error, _transient_errors()))
