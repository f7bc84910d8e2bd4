"""Credential values replaced by ``***`` in any text (messages, log records), and which
storage option values are credentials.

An option is a credential when its name says so (``key``, ``secret``, ``token``,
``password``, ``credentials``, ``session``...), at any depth of nested options
(``client_kwargs={"aws_secret_access_key": ...}``); the caller may add names of its own
(options a path type does not know, which may be a mistyped ``secret``).

Example::

    >>> mask("signed with s3cr3t-key", ["s3cr3t-key"])
    'signed with ***'
    >>> credential_values({"secret": "s3cr3t-key", "part_size": 8, "anon": False})
    ['s3cr3t-key']
    >>> credential_values({"client_kwargs": {"aws_session_token": "t0ken-value"}})
    ['t0ken-value']
"""

from __future__ import annotations

import logging
import re
from collections.abc import Collection, Iterable, Iterator, Mapping
from contextlib import contextmanager
from urllib.parse import parse_qsl, urlsplit

__all__ = [
    "CREDENTIAL_NAME",
    "MIN_SECRET_LENGTH",
    "MaskingFilter",
    "credential_values",
    "is_credential_name",
    "mask",
    "masking_logs",
    "url_secrets",
]

MIN_SECRET_LENGTH = 4
"""Shorter credential values are not masked (they would garble every message)."""

CREDENTIAL_NAME = re.compile(
    r"key|secret|token|passw|pwd|credential|session|auth|sig|private|cert|sas",
    re.IGNORECASE,
)
"""What in an option's name marks its value as a credential."""


def mask(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every credential value of ``secrets`` replaced by ``***``."""
    for secret in sorted(secrets, key=len, reverse=True):
        if len(secret) >= MIN_SECRET_LENGTH:
            text = text.replace(secret, "***")
    return text


def is_credential_name(name: str) -> bool:
    """Whether an option called ``name`` holds a credential (``secret``, ``api_key``,
    ``aws_session_token``, ``password``...).

    Example::

        >>> is_credential_name("aws_secret_access_key"), is_credential_name("part_size")
        (True, False)
    """
    return CREDENTIAL_NAME.search(name) is not None


def credential_values(options: Mapping[str, object], also: Collection[str] = ()) -> list[str]:
    """The values to mask among ``options``: those of every option, at any depth, whose
    name is a credential's, and of the top-level options named in ``also``; scalars as
    text, the values inside lists and mappings one by one."""
    found: list[str] = []
    for name, value in options.items():
        if name in also or is_credential_name(str(name)):
            found.extend(_scalars(value))
        elif isinstance(value, Mapping):
            found.extend(credential_values(value))
    return found


def _scalars(value: object) -> list[str]:
    if isinstance(value, Mapping):
        return [text for item in value.values() for text in _scalars(item)]
    if isinstance(value, list | tuple | set | frozenset):
        return [text for item in value for text in _scalars(item)]
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, str):
        return list({value, repr(value)[1:-1]})  # as given, and escaped as repr() shows it
    if isinstance(value, int | float):
        return [str(value)]
    return []


def url_secrets(url: str) -> list[str]:
    """The credentials a URL carries: the password of ``user:password@`` and the values
    of credential-named query parameters (``?sig=...``, ``?token=...``).

    Example::

        >>> url_secrets("ftp://me:hunter22@host/run?sig=abcdef&x=1")
        ['hunter22', 'abcdef']
    """
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # not a URL urllib can split (`http://[broken`): nothing to find
        return []
    query = dict(parse_qsl(parts.query))
    return ([password] if password else []) + credential_values(query)


@contextmanager
def masking_logs(secrets: Iterable[str]) -> Iterator[None]:
    """While inside: every log record handled by the root logger's handlers (or
    :data:`logging.lastResort`, which prints warnings when none is configured) has
    ``secrets`` masked."""
    masking = MaskingFilter(secrets)
    handlers = [*logging.getLogger().handlers, logging.lastResort]
    for handler in handlers:
        if handler is not None:
            handler.addFilter(masking)
    try:
        yield
    finally:
        for handler in handlers:
            if handler is not None:
                handler.removeFilter(masking)


class MaskingFilter(logging.Filter):
    """A :mod:`logging` filter (for a handler or a logger) that masks ``secrets`` in
    every record's message, arguments included.

    Example::

        >>> import logging
        >>> record = logging.LogRecord("x", logging.WARNING, "", 0, "key %s", ("hunter22",), None)
        >>> MaskingFilter(["hunter22"]).filter(record), record.getMessage()
        (True, 'key ***')
    """

    def __init__(self, secrets: Iterable[str]) -> None:
        super().__init__()
        self.secrets = tuple(secrets)

    def filter(self, record: logging.LogRecord) -> bool:
        if self.secrets:
            message = record.getMessage()
            masked = mask(message, self.secrets)
            if masked != message:
                record.msg, record.args = masked, ()
            if record.exc_info and record.exc_info[1] is not None:
                # the traceback's text is formatted later: format it now, masked
                text = logging.Formatter().formatException(record.exc_info)
                record.exc_text = mask(text, self.secrets)
        return True
