"""Reading ``CKPTSTORE_*`` environment variables: a value that cannot be used raises
:class:`~ckptstore.errors.EnvironmentVariableError` naming the variable and the fix,
never a bare ``ValueError`` from ``int()``.

Example::

    >>> import os
    >>> int_variable({}, "CKPTSTORE_IO_CONCURRENCY") is None  # None when unset
    True
    >>> int_variable({"CKPTSTORE_IO_CONCURRENCY": "8"}, "CKPTSTORE_IO_CONCURRENCY")
    8
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from ckptstore.errors import EnvironmentVariableError

__all__ = ["choice_variable", "int_variable"]


def int_variable(env: Mapping[str, str], name: str) -> int | None:
    """The integer in ``env[name]`` (``None`` when unset or empty)."""
    raw = env.get(name)
    if not raw:
        return None
    try:
        return int(raw.strip().replace("_", ""))
    except ValueError:
        raise EnvironmentVariableError(name, raw, "a whole number (bytes or a count)") from None


def choice_variable(env: Mapping[str, str], name: str, choices: Collection[str]) -> str | None:
    """``env[name]`` when it is one of ``choices`` (``None`` when unset or empty)."""
    raw = env.get(name)
    if not raw:
        return None
    if raw not in choices:
        raise EnvironmentVariableError(name, raw, f"one of {', '.join(sorted(choices))}")
    return raw
