"""Storage options on the command line (``-o KEY=VALUE``): parsing them and opening a
URL with them, so a wrong option is one line naming it and the fix, never a traceback.

Example::

    >>> import contextlib, sys
    >>> from ckptstore.cli import main
    >>> with contextlib.redirect_stderr(sys.stdout):  # `ckptstore ls ./ckpt -o durabilty=fsync`
    ...     main(["ls", "./ckpt", "-o", "durabilty=fsync"])
    ckptstore: error: storage option for ./ckpt (path type 'local'): -o durabilty='fsync' refused
    (local path type takes only 'durability' and 'direct_io', ...); did you mean -o durability=...?
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
from ckptstore.plugin._path_type import PathType
from ckptstore.plugin._registry import Registry

__all__ = ["accepted_options", "key_value", "open_with_options", "parse_options"]

_ACCEPTED = re.compile(r"accepted: ([\w, ]+)")
_NOT_OPTIONS = {"self", "url"}


def key_value(text: str) -> tuple[str, str]:
    """argparse ``type=`` of ``-o``: ``"anon=true"`` -> ``("anon", "true")``."""
    key, separator, raw = text.partition("=")
    if not separator or not key.strip():
        raise argparse.ArgumentTypeError(
            f"storage option {text!r} is not KEY=VALUE (for example: -o anon=true)"
        )
    return key.strip(), raw


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
    or the accepted list."""
    factory = registry.path_type_for(url, path_type)
    try:
        return factory(url, **options)
    except CkptStoreError:
        raise
    except (TypeError, ValueError) as error:
        if not options:
            raise
        accepted = accepted_options(factory, str(error))
        given = ", ".join(f"{flag} {key}={options[key]!r}" for key in options)
        guesses = [
            f"{flag} {close}=..."
            for key in options
            if key not in accepted and (close := closest(key, accepted)) is not None
        ]
        named = [  # options the error names whose name is not what is wrong
            key for key in options if key in str(error) and (key in accepted or not accepted)
        ]
        if guesses:
            fix = f"did you mean {', '.join(guesses)}?"
        elif named:  # the name is accepted, its value is not
            fix = f"correct the value of {flag} {named[0]}=..."
        elif accepted:
            fix = f"options {factory.name!r} accepts: {', '.join(accepted)}"
        else:
            fix = f"remove {flag} (see docs/object-stores.md for each path type's options)"
        detail = f"{given} refused ({error})"
        raise StorageOptionError(url, factory.name, detail, fix) from None
