"""How the operator commands report failure: one line on stderr for people and, with
``--json``, a JSON document on stdout for scripts, so stdout is always valid JSON in
JSON mode.

Example::

    >>> import contextlib, sys
    >>> from ckptstore.cli._common import EXIT_NOT_FOUND
    >>> with contextlib.redirect_stderr(sys.stdout):
    ...     fail("no committed epoch under ./ckpt", EXIT_NOT_FOUND, json_mode=True)
    ckptstore: error: no committed epoch under ./ckpt
    {
      "error": {
        "exit_code": 4,
        "message": "no committed epoch under ./ckpt",
        "type": "error"
      }
    }
    4
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

__all__ = ["fail", "wants_json"]


def wants_json(argv: Sequence[str]) -> bool:
    """Whether the command line asks for JSON output (before it is parsed: a usage
    error must be reported in JSON too)."""
    return "--json" in argv[: argv.index("--")] if "--" in argv else "--json" in argv


def fail(message: str, code: int, *, json_mode: bool, kind: str = "error") -> int:
    """Report an error: ``ckptstore: error: MESSAGE`` on stderr, and with ``json_mode``
    ``{"error": {"type", "message", "exit_code"}}`` on stdout. Returns ``code``."""
    print(f"ckptstore: error: {message}", file=sys.stderr)
    if json_mode:
        error = {"type": kind, "message": message, "exit_code": code}
        print(json.dumps({"error": error}, indent=2, sort_keys=True))
    return code
