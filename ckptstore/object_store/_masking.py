"""Credential values replaced by ``***`` in any text (messages, log records).

Example::

    >>> mask("signed with s3cr3t-key", ["s3cr3t-key"])
    'signed with ***'
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["MIN_SECRET_LENGTH", "mask"]

MIN_SECRET_LENGTH = 4
"""Shorter credential values are not masked (they would garble every message)."""


def mask(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every credential value of ``secrets`` replaced by ``***``."""
    for secret in sorted(secrets, key=len, reverse=True):
        if len(secret) >= MIN_SECRET_LENGTH:
            text = text.replace(secret, "***")
    return text
