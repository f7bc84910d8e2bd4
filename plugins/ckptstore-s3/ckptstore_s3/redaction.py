"""Keeps credentials out of log records, including botocore's own DEBUG output (which
prints request headers: the access key id and any session token).

:func:`protect` registers credential values; a filter on botocore's and s3fs's loggers
replaces them with ``***`` in every record before any handler sees it. The filter only
runs for records that are actually emitted, so it costs nothing at the usual levels.

Example::

    >>> import logging
    >>> protect(["AKIAEXAMPLEKEY", "s3cr3t-value"])
    >>> logging.getLogger("botocore.endpoint").debug("Authorization: AKIAEXAMPLEKEY")  # masked
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from ckptstore.object_store import MIN_SECRET_LENGTH, mask

__all__ = ["PROTECTED_LOGGERS", "SecretMaskingFilter", "protect"]

PROTECTED_LOGGERS = (
    "botocore.endpoint",
    "botocore.auth",
    "botocore.parsers",
    "botocore.httpsession",
    "botocore.credentials",
    "botocore.utils",
    "aiobotocore.endpoint",
    "aiobotocore.httpsession",
    "aiobotocore.credentials",
    "s3fs",
    "ckptstore_s3",
)

_secrets: set[str] = set()
_lock = threading.Lock()
_installed = False


class SecretMaskingFilter(logging.Filter):
    """Masks every registered credential value in a record's message.

    Example::

        >>> import logging
        >>> logging.getLogger("botocore.auth").addFilter(SecretMaskingFilter())
    """

    def filter(self, record: logging.LogRecord) -> bool:
        with _lock:
            secrets = tuple(_secrets)
        if secrets:
            message = record.getMessage()
            masked = mask(message, secrets)
            if masked != message:
                record.msg, record.args = masked, ()
        return True


def protect(secrets: Iterable[str]) -> None:
    """Mask ``secrets`` in the records of :data:`PROTECTED_LOGGERS` from now on."""
    global _installed
    values = {secret for secret in secrets if len(secret) >= MIN_SECRET_LENGTH}
    with _lock:
        _secrets.update(values)
        install = not _installed and bool(_secrets)
        _installed = _installed or install
    if install:
        masking = SecretMaskingFilter()
        for name in PROTECTED_LOGGERS:
            logging.getLogger(name).addFilter(masking)
