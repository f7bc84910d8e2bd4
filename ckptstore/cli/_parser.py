"""The command-line parser: argparse with "did you mean" for mistyped commands and
options. Usage errors are raised as :class:`UsageError` so the entry point reports them
like every other error (exit 2, and JSON on stdout with ``--json``).

Example::

    >>> import contextlib, sys
    >>> from ckptstore.cli import main
    >>> with contextlib.redirect_stderr(sys.stdout):  # `ckptstore lss ./ckpt`
    ...     main(["lss", "./ckpt"])
    usage: ckptstore [-h] [--version] COMMAND ...
    ckptstore: error: unknown command 'lss'; did you mean ls? (see ckptstore --help)
    2
    >>> with contextlib.redirect_stderr(sys.stdout):  # `ckptstore ls ./ckpt --jsn`
    ...     main(["ls", "./ckpt", "--jsn"])
    usage: ...
    ckptstore: error: unknown option --jsn; did you mean --json? (see ckptstore ls --help)
    2
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Iterable, Sequence
from typing import NoReturn

from ckptstore._suggest import closest

__all__ = ["CliParser", "UsageError", "at_least", "did_you_mean"]

_INVALID_CHOICE = re.compile(r"argument (\S+): invalid choice: '([^']*)'")


class UsageError(Exception):
    """A bad command line; ``parser`` is the (sub-)command's parser, for its usage."""

    def __init__(self, message: str, parser: argparse.ArgumentParser) -> None:
        super().__init__(f"{message} (see {parser.prog} --help)")
        self.parser = parser


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """``"; did you mean X?"`` for the closest of ``candidates`` to ``word``, else ``""``."""
    close = closest(word, candidates)
    return f"; did you mean {close}?" if close else ""


def at_least(minimum: int) -> Callable[[str], int]:
    """argparse ``type=`` of a whole-number option with a lower bound: a smaller value
    (``gc --keep-last 0``) is a usage error (exit 2) naming the bound, as a non-number is.

    Example::

        >>> at_least(1)("3")
        3
        >>> at_least(1)("0")
        Traceback (most recent call last):
        argparse.ArgumentTypeError: 0 is too small: expected a whole number >= 1
    """

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a whole number (expected one >= {minimum})"
            ) from None
        if value < minimum:
            raise argparse.ArgumentTypeError(
                f"{value} is too small: expected a whole number >= {minimum}"
            )
        return value

    return parse


class CliParser(argparse.ArgumentParser):
    """An :class:`argparse.ArgumentParser` whose errors name the closest command or
    option and raise :class:`UsageError` instead of exiting."""

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        self._argv = list(args) if args is not None else None
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self._command_parser(parsed).unrecognized(extras)
        return parsed

    def _command_parser(self, parsed: argparse.Namespace) -> CliParser:
        """The chosen sub-command's parser (it knows the options), else this one."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                chosen = action.choices.get(getattr(parsed, action.dest, None) or "")
                if isinstance(chosen, CliParser):
                    return chosen
        return self

    def option_names(self) -> list[str]:
        return [name for action in self._actions for name in action.option_strings]

    def unrecognized(self, extras: Sequence[str]) -> NoReturn:
        option = next((word.split("=", 1)[0] for word in extras if word.startswith("-")), None)
        if option is None:  # a KEY=VALUE word is shown without its value: it may be a secret
            shown = [word.split("=", 1)[0] + "=***" if "=" in word else word for word in extras]
            assigned = any("=" in word for word in extras)
            hint = "; a storage option goes after -o (-o KEY=VALUE)" if assigned else ""
            raise UsageError(f"unexpected argument(s): {' '.join(shown)}{hint}", self)
        raise UsageError(
            f"unknown option {option}{did_you_mean(option, self.option_names())}", self
        )

    def error(self, message: str) -> NoReturn:
        invalid = _INVALID_CHOICE.match(message)
        if invalid:
            word = invalid.group(2)
            choices = [
                str(choice)
                for action in self._actions
                if isinstance(action, argparse._SubParsersAction)
                for choice in action.choices
            ]
            if choices:
                message = f"unknown command {word!r}" + did_you_mean(word, choices)
        elif message.startswith("the following arguments are required"):
            # `ckptstore --verison`: the unknown option, not the missing command, is the news
            unknown = [
                word.split("=", 1)[0]
                for word in getattr(self, "_argv", None) or []
                if word.startswith("-") and word.split("=", 1)[0] not in self.option_names()
            ]
            if unknown:
                self.unrecognized(unknown)
        raise UsageError(message, self)
