"""Storage options on the command line (``-o KEY=VALUE``): parsing them and opening a
URL with them, so a wrong option is one line naming it and the fix, never a traceback,
and never a credential: the values of credential options (and of unknown ones, which may
be a mistyped credential) are shown as ``***``.

Example::

    >>> import contextlib, sys
    >>> from ckptstore.cli import main
    >>> with contextlib.redirect_stderr(sys.stdout):  # `ckptstore ls ./ckpt -o durabilty=fsync`
    ...     main(["ls", "./ckpt", "-o", "durabilty=fsync"])
    ckptstore: error: storage option for ./ckpt (path type 'local'): -o durabilty='fsync' refused
    (local path type takes only 'durability' and 'direct_io', ...); -o durabilty is unknown: did
    you mean -o durability=...?
    1
    >>> with contextlib.redirect_stderr(sys.stdout):  # `... -o bogus=1 -o secret=s3cr3t`
    ...     main(["ls", "s3://bucket/run", "-o", "bogus=1", "-o", "secret=s3cr3t"])
    ckptstore: error: storage option for s3://bucket/run (path type 's3'): -o bogus=***,
    -o secret=*** refused (unknown S3 storage option(s) ['bogus']; accepted: ...); remove -o bogus
    1
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ckptstore._suggest import closest
from ckptstore.errors import CkptStoreError, StorageOptionError
from ckptstore.object_store import credential_values, is_credential_name, mask, url_secrets
from ckptstore.plugin import PathType, Registry, redact_url

__all__ = [
    "accepted_options",
    "command_line_secrets",
    "key_value",
    "open_with_options",
    "parse_options",
]

_ACCEPTED = re.compile(r"accepted: ([\w, ]+)")
_NOT_OPTIONS = {"self", "url"}


def key_value(text: str) -> tuple[str, str]:
    """argparse ``type=`` of ``-o``: ``"anon=true"`` -> ``("anon", "true")``."""
    key, separator, raw = text.partition("=")
    if not separator or not key.strip():
        shown = text if not separator else "=***"  # never echo a value: it may be a secret
        raise argparse.ArgumentTypeError(
            f"storage option {shown!r} is not KEY=VALUE (for example: -o anon=true)"
        )
    return key.strip(), raw


def command_line_secrets(words: Sequence[str]) -> list[str]:
    """The credentials in raw command-line ``words`` (before they are parsed, for usage
    errors): values of credential-named ``KEY=VALUE`` words (``--option=KEY=VALUE`` and
    ``--secret=VALUE`` too; JSON values looked into) and those in URLs.

    Example::

        >>> command_line_secrets(["ls", "ftp://me:hunter22@host/x", "--option=secret=s3cr3t"])
        ['hunter22', 's3cr3t']
    """
    found: list[str] = []
    for word in words:
        if "://" in word:
            found += url_secrets(word)
        elif "=" in word:
            key, _, value = word.lstrip("-").partition("=")
            pairs = [(key, value)]
            if word.startswith("-") and "=" in value:  # --option=KEY=VALUE
                inner, _, inner_value = value.partition("=")
                pairs.append((inner, inner_value))
            found += credential_values(parse_options(pairs))
    return found


def parse_options(pairs: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """Options from ``(key, value)`` pairs (see :func:`key_value`); values are JSON when
    they parse as JSON (``true``, ``3``, ``{"a": 1}``), strings otherwise."""
    options: dict[str, Any] = {}
    for key, raw in pairs:
        try:
            options[key] = json.loads(raw)
        except json.JSONDecodeError:
            options[key] = raw
    return options


def accepted_options(factory: type[PathType], message: str = "") -> list[str]:
    """The option names ``factory`` takes, from its signature and from the list an
    "unknown option" ``message`` gives."""
    names = [
        parameter.name
        for parameter in inspect.signature(factory.__init__).parameters.values()
        if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
        and parameter.name not in _NOT_OPTIONS
    ]
    listed = _ACCEPTED.search(message)
    if listed:
        names += [name.strip() for name in listed.group(1).split(",") if name.strip()]
    return sorted(set(names))


def open_with_options(
    registry: Registry,
    url: str,
    path_type: str | None,
    options: Mapping[str, Any],
    flag: str = "-o",
) -> PathType:
    """``registry.open_path(url, path_type, **options)``; an option the path type
    refuses raises :class:`StorageOptionError` naming it, with the closest accepted name
    or the accepted list. The message never holds a credential: values of options named
    like one (``secret``, ``token``...) and of options the path type does not know (a
    mistyped ``secret``) are masked, and so is any credential in the URL."""
    factory = registry.path_type_for(url, path_type)
    try:
        return factory(url, **options)
    except CkptStoreError:
        raise
    except (TypeError, ValueError) as error:
        if not options:
            raise
        text = str(error)
        accepted = accepted_options(factory, text)
        unknown = {
            key: closest(key, accepted) for key in options if accepted and key not in accepted
        }
        # an unknown option may be a mistyped credential (`secert`): its value is masked
        # unless it is close to an option that is not one (`durabilty`)
        hidden = [
            key for key, close in unknown.items() if close is None or is_credential_name(close)
        ]
        secrets = credential_values(options, also=hidden)
        given = ", ".join(
            f"{flag} {key}=***"
            if key in hidden or is_credential_name(key)
            else f"{flag} {key}={options[key]!r}"
            for key in options
        )
        detail = mask(f"{given} refused ({text})", secrets)
        fix = mask(_fix(factory.name, flag, options, text, accepted, unknown), secrets)
        raise StorageOptionError(redact_url(url), factory.name, detail, fix) from None


def _fix(
    name: str,
    flag: str,
    options: Mapping[str, Any],
    text: str,
    accepted: list[str],
    unknown: Mapping[str, str | None],
) -> str:
    """What to do about options path type ``name`` refused with message ``text``: for
    each unknown option (with the accepted one closest to it, if any), that one or the
    accepted list; else the option whose value the message names."""
    if unknown:
        fixes = [
            f"{flag} {key} is unknown: did you mean {flag} {close}=...?"
            for key, close in unknown.items()
            if close is not None
        ]
        unmatched = [f"{flag} {key}" for key, close in unknown.items() if close is None]
        if unmatched:
            listed = _ACCEPTED.search(text)  # the message lists them already
            also = "" if listed else f" (options {name!r} accepts: {', '.join(accepted)})"
            fixes.append(f"remove {', '.join(unmatched)}{also}")
        return "; ".join(fixes)
    about = _ACCEPTED.sub("", text)  # the accepted list names every option: not a clue
    named = [key for key in options if re.search(rf"\b{re.escape(key)}\b", about)]
    if named:  # the name is accepted, its value is not
        return f"correct the value of {flag} {named[0]}=..."
    if accepted:
        return f"correct the value of {' or '.join(f'{flag} {key}' for key in options)}"
    return f"remove {flag} (see docs/object-stores.md for each path type's options)"
