"""``ckptstore``: entry point of the command line.

Example::

    $ ckptstore demo            # train, checkpoint, resume on a second run
    $ ckptstore plugins         # what is installed
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ckptstore.cli import demo_command, plugins_command
from ckptstore.errors import CkptStoreError

__all__ = ["main"]

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ckptstore",
        description="Checkpoint ML training state to local disk and object stores.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (demo_command, plugins_command):
        module.register(commands)
    return parser


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
    return code


if __name__ == "__main__":
    sys.exit(main())
