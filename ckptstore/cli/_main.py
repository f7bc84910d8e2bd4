"""``ckptstore``: entry point of the command line.

Example::

    $ ckptstore demo            # train, checkpoint, resume on a second run
    $ ckptstore plugins         # what is installed
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence
from typing import Any

import ckptstore.cli
from ckptstore.errors import CkptStoreError

__all__ = ["main"]

EXIT_OK = 0
"""Success."""
EXIT_ERROR = 1
"""A ckptstore error (message on stderr)."""
EXIT_USAGE = 2
"""Bad command line (argparse's convention)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ckptstore",
        description="Checkpoint ML training state to local disk and object stores.",
    )
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
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.run(args)
    except CkptStoreError as error:
        print(f"ckptstore: error: {error}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("ckptstore: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (`ckptstore ls | head`): stop quietly, as Unix tools do
        sys.stderr.close()
        return EXIT_OK
    return code


if __name__ == "__main__":
    sys.exit(main())
