"""What a piece of code imports, asked of a fresh interpreter: for tests that keep a
plugin's registration (or any start-up path) free of heavy libraries, which every
process building ckptstore's plugin registry would otherwise pay for (docs/plugins.md).

Example::

    >>> imported_modules("import email.message", ["email", "numpy"])
    ['email']
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterable

__all__ = ["imported_modules"]

_MARK = "ckptstore.testing.imported_modules:"


def imported_modules(script: str, names: Iterable[str]) -> list[str]:
    """Which of the packages ``names`` a fresh interpreter imported while running ``script``.

    The interpreter is this one's executable, with this environment. The result is
    sorted. Raises :class:`AssertionError` with the script's error output if it
    fails."""
    watched = sorted(set(names))
    report = (
        "\nimport json as _json, sys as _sys\n"
        f"_loaded = {{_name.partition('.')[0] for _name in _sys.modules}}\n"
        f"print({_MARK!r} + _json.dumps([_n for _n in {watched!r} if _n in _loaded]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script + report], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise AssertionError(f"the script failed (exit {result.returncode}):\n{result.stderr}")
    line = next(line for line in reversed(result.stdout.splitlines()) if line.startswith(_MARK))
    found: list[str] = json.loads(line[len(_MARK) :])
    return found
