"""``ckptstore``: entry point of the command line.

Example::

    >>> import contextlib, sys
    >>> from ckptstore.cli import main
    >>> with contextlib.redirect_stderr(sys.stdout):  # `ckptstore ls ./nothing`
    ...     main(["ls", "./nothing"])
    ckptstore: error: nothing at ./nothing: no such directory or prefix; check the URL
    (and -o options such as the endpoint)
    4
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence
from typing import Any

import ckptstore.cli
from ckptstore import __version__
from ckptstore.cli._options import command_line_secrets
from ckptstore.cli._output import fail, wants_json
from ckptstore.cli._parser import CliParser, UsageError
from ckptstore.errors import CkptStoreError
from ckptstore.object_store import mask

__all__ = ["main"]

EXIT_OK = 0
"""Success."""
EXIT_ERROR = 1
"""A ckptstore error (message on stderr)."""
EXIT_USAGE = 2
"""Bad command line (argparse's convention)."""


def build_parser() -> argparse.ArgumentParser:
    parser = CliParser(
        prog="ckptstore",
        description="Checkpoint ML training state to local disk and object stores.",
    )
    parser.add_argument("--version", action="version", version=f"ckptstore {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in command_modules():
        module.register(commands)
    return parser


def command_modules() -> list[Any]:
    """Every ``ckptstore.cli._*_command`` module: each adds one sub-command with
    ``register(subparsers)`` and sets ``run(args) -> exit code`` as its default."""
    names = sorted(
        info.name
        for info in pkgutil.iter_modules(ckptstore.cli.__path__)
        if info.name.endswith("_command")
    )
    return [importlib.import_module(f"ckptstore.cli.{name}") for name in names]


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    json_mode = wants_json(arguments)
    parser = build_parser()
    try:
        args = parser.parse_args(arguments)
    except UsageError as error:
        error.parser.print_usage(sys.stderr)
        message = mask(str(error), command_line_secrets(arguments))
        return fail(message, EXIT_USAGE, json_mode=json_mode, kind="UsageError")
    try:
        code: int = args.run(args)
    except CkptStoreError as error:
        return fail(str(error), EXIT_ERROR, json_mode=json_mode, kind=type(error).__name__)
    except OSError as error:  # the disk or network refused (`demo --dir` unwritable...)
        if isinstance(error, BrokenPipeError):
            # the reader went away (`ckptstore ls | head`): stop quietly, as Unix tools do
            sys.stderr.close()
            return EXIT_OK
        return fail(str(error), EXIT_ERROR, json_mode=json_mode, kind=type(error).__name__)
    except KeyboardInterrupt:
        print("ckptstore: interrupted", file=sys.stderr)
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
