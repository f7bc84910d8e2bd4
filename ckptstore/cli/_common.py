"""What the operator commands share: exit codes, opening URLs, output and errors.

Exit codes scripts can rely on (also in ``docs/cli.md``)::

    0  success
    1  error (storage unreachable, unknown plugin, bad option...)
    2  bad command line
    3  corrupt checkpoint: damaged, forged or missing data (any command)
    4  not found: the epoch or checkpoint asked for is not committed, or nothing is at
       the URL (``ls``)
    130 interrupted

Example::

    >>> import argparse
    >>> from ckptstore.tree import save_tree
    >>> def run(args):
    ...     storage = open_storage(args.url, args)  # with its -o KEY=VALUE options
    ...     print(chosen_epochs(storage, args))
    ...     return EXIT_OK
    >>> def register(commands):
    ...     add_command(commands, "epochs", guarded(run), summary="list epochs",
    ...                 description="The committed epochs of a checkpoint root.",
    ...                 arguments=lambda parser: add_epoch_selection(parser, "this epoch"))
    >>> parser = argparse.ArgumentParser(prog="ckptstore")
    >>> register(parser.add_subparsers())
    >>> for epoch in (1, 2):
    ...     save_tree("ckpt", epoch, {"step": epoch})
    >>> args = parser.parse_args(["epochs", "ckpt", "--latest"])
    >>> args.run(args)
    [2]
    0
    >>> args = parser.parse_args(["epochs", "ckpt", "-o", "durabilty=fsync"])  # a typo
    >>> args.run(args) == EXIT_ERROR  # one line on stderr says which option, no traceback
    True
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from ckptstore.cli._main import EXIT_ERROR, EXIT_OK, EXIT_USAGE
from ckptstore.cli._options import key_value, open_with_options, parse_options
from ckptstore.cli._output import fail
from ckptstore.cli._progress import ProgressBar
from ckptstore.errors import CheckpointNotFoundError, CkptStoreError, CorruptCheckpointError
from ckptstore.execution import DEFAULT_NODE
from ckptstore.object_store import credential_values, mask, masking_logs, url_secrets
from ckptstore.plugin import PathType, get_registry
from ckptstore.protocol import CommitListing, require_commit
from ckptstore.records import CONTROL_DIR, validate_epoch

__all__ = [
    "DEFAULT_NODE_MARK",
    "DEFAULT_NODE_NOTE",
    "EXIT_CORRUPT",
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_USAGE",
    "add_command",
    "add_epoch_selection",
    "add_json_flag",
    "add_progress_flag",
    "add_storage_options",
    "chosen_epochs",
    "committed",
    "epoch_argument",
    "format_bytes",
    "given_secrets",
    "guarded",
    "location_exists",
    "no_committed_epoch",
    "nothing_at",
    "open_storage",
    "print_json",
]

EXIT_CORRUPT = 3
"""Verification failed: corrupt or missing data."""
EXIT_NOT_FOUND = 4
"""The epoch or checkpoint asked for is not committed."""
EXIT_INTERRUPTED = 130
"""Interrupted (Ctrl-C)."""

DEFAULT_NODE_MARK = "(default node)"
"""Shown beside the default node's name in listings."""
DEFAULT_NODE_NOTE = (
    f"note: node {DEFAULT_NODE!r} {DEFAULT_NODE_MARK} runs the tasks created outside any "
    "`with Node(...)`, such as epoch_limiter's epoch counter; it is checkpointed with the "
    "job's other nodes"
)
"""Printed once under a listing that shows the default node, saying what it is."""

Runner = Callable[[argparse.Namespace], int]
ROOT = (("url", "checkpoint root"),)
"""The URL argument of most commands: one checkpoint root."""


def add_command(
    commands: Any,
    name: str,
    run: Runner,
    *,
    summary: str,
    description: str,
    urls: Sequence[tuple[str, str]] = ROOT,
    arguments: Callable[[argparse.ArgumentParser], None] | None = None,
    progress: bool = True,
) -> argparse.ArgumentParser:
    """Add the operator command ``name`` running ``run``: its URL arguments (``(name,
    help)`` pairs), its own ``arguments``, ``--json``, ``--progress`` (unless
    ``progress`` is false) and the storage options of its URLs (``-o`` for one URL,
    ``--<name>-option`` for several)."""
    parser: argparse.ArgumentParser = commands.add_parser(
        name, help=summary, description=description
    )
    for dest, text in urls:
        parser.add_argument(dest, help=text)
    if arguments is not None:
        arguments(parser)
    add_json_flag(parser)
    if progress:
        add_progress_flag(parser)
    add_storage_options(parser, *([dest for dest, _ in urls] if len(urls) > 1 else []))
    parser.set_defaults(run=run)
    return parser


def add_epoch_selection(parser: argparse.ArgumentParser, epoch_help: str) -> None:
    """``--epoch N`` (repeatable) and ``--latest``: the epochs a command acts on."""
    parser.add_argument("--epoch", type=epoch_argument, action="append", help=epoch_help)
    parser.add_argument("--latest", action="store_true", help="only the newest committed epoch")


def epoch_argument(text: str) -> int:
    """argparse ``type=`` of every epoch option: a non-negative integer (``"3"``), else
    a usage error (exit 2) whose one line says what an epoch is."""
    try:
        return validate_epoch(int(text, 10))
    except ValueError:  # not digits, or InvalidEpochError (negative, too large)
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an epoch: use a non-negative integer below 2**63, such as 3"
        ) from None


def committed(storage: PathType) -> list[int]:
    """The epochs with a commit record in ``storage``, ascending, from the one listing
    resume takes (:class:`~ckptstore.protocol.CommitListing`). Unlike resume, the
    commands do not pass over a damaged newest epoch: they act on it and report the
    damage (exit 3, naming the epoch)."""
    return CommitListing.of(storage).epochs


def chosen_epochs(storage: PathType, args: argparse.Namespace) -> list[int]:
    """The epochs ``--epoch``/``--latest`` select among those committed in ``storage``."""
    return parse_epochs(args.epoch, committed(storage), latest=args.latest)


def epochs_progress(
    storage: PathType,
    epochs: Sequence[int],
    label: str,
    args: argparse.Namespace,
    *,
    unit: str = "bytes",
    passes: int = 1,
) -> ProgressBar:
    """The ``--progress`` bar of a command over every node of ``epochs`` (each must be
    committed): their stored bytes (``passes`` times: a command going over them twice),
    or with ``unit="nodes"`` their number."""
    nodes = [node for epoch in epochs for node in require_commit(storage, epoch).nodes.values()]
    total = passes * sum(node.stored_bytes for node in nodes) if unit == "bytes" else len(nodes)
    return ProgressBar(total, label, unit=unit, enabled=args.progress)


def location_exists(storage: PathType) -> bool:
    """Whether anything is at ``storage``'s root: the directory, on this machine's disk;
    at least one object under the prefix, for object stores (they have no directories)."""
    directory = storage.local_directory()
    if directory is not None:
        return os.path.isdir(directory)
    return bool(storage.list_keys(""))


def nothing_at(storage: PathType, args: argparse.Namespace) -> int:
    """Say that nothing is at ``storage``'s URL (a mistyped root, not an empty one), or
    that it is a file where a checkpoint root (a directory) is expected; the exit code
    for it."""
    path = storage.local_directory()
    if path is not None and os.path.isfile(path):
        message = f"{storage.display_url} is a file, not a checkpoint root: {_instead(path)}"
    else:
        message = (
            f"nothing at {storage.display_url}: no such directory or prefix; check the URL "
            "(and -o options such as the endpoint)"
        )
    return fail(
        message,
        EXIT_NOT_FOUND,
        json_mode=bool(getattr(args, "json", False)),
        kind="NotFound",
    )


def _instead(path: str) -> str:
    """What to pass instead of the file ``path``: the checkpoint root it is in (the
    nearest directory above it holding ckptstore's control directory), else a directory."""
    directory = os.path.dirname(os.path.abspath(path))
    candidate = directory
    while not os.path.isdir(os.path.join(candidate, CONTROL_DIR)):
        parent = os.path.dirname(candidate)
        if parent == candidate:
            return f"pass the directory that holds the checkpoints (this file is in {directory})"
        candidate = parent
    return f"pass the checkpoint root it belongs to, {candidate}"


def no_committed_epoch(storage: PathType, args: argparse.Namespace) -> int:
    """Say that ``storage`` has no (such) committed epoch; the exit code for it."""
    return fail(
        f"no committed epoch under {storage.display_url}; check the URL with `ckptstore ls`",
        EXIT_NOT_FOUND,
        json_mode=bool(getattr(args, "json", False)),
        kind="CheckpointNotFoundError",
    )


def guarded(run: Runner) -> Runner:
    """Wrap a command so ckptstore errors become a message on stderr and an exit code."""

    @functools.wraps(run)
    def wrapper(args: argparse.Namespace) -> int:
        json_mode = bool(getattr(args, "json", False))
        secrets = given_secrets(args)
        try:
            with masking_logs(secrets):
                return run(args)
        except CheckpointNotFoundError as error:
            return _fail(error, EXIT_NOT_FOUND, json_mode, secrets)
        except CorruptCheckpointError as error:
            return _fail(error, EXIT_CORRUPT, json_mode, secrets)
        except CkptStoreError as error:
            return _fail(error, EXIT_ERROR, json_mode, secrets)
        except ValueError as error:  # bad option values (IOSettings, path type options)
            return _fail(error, EXIT_ERROR, json_mode, secrets)
        except BrokenPipeError:  # `ckptstore ls URL | head`: the reader has had enough
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return EXIT_OK
        except (OSError, MemoryError, RecursionError) as error:
            # never a traceback: whatever is stored, the operator gets one line
            return _fail(error, EXIT_ERROR, json_mode, secrets)

    return wrapper


def given_secrets(args: argparse.Namespace) -> list[str]:
    """Every credential on the command line: the values of credential-named storage
    options (``-o secret=...``, ``--dst-option token=...``) and those in URLs
    (``user:password@``, ``?sig=...``), to mask in whatever the command prints."""
    secrets: list[str] = []
    for name, value in vars(args).items():
        if name.endswith("options") and isinstance(value, list):
            secrets += credential_values(parse_options(value))
        elif isinstance(value, str) and "://" in value:
            secrets += url_secrets(value)
    return secrets


def _fail(error: Exception, code: int, json_mode: bool, secrets: Sequence[str]) -> int:
    message = " ".join(str(error).split()) or type(error).__name__  # one line, always
    return fail(mask(message, secrets), code, json_mode=json_mode, kind=type(error).__name__)


def add_storage_options(parser: argparse.ArgumentParser, *names: str) -> None:
    """``--path-type`` and ``-o KEY=VALUE`` options for each URL argument in ``names``
    (one URL: plain ``-o``; several: ``--<name>-option``)."""
    for name in names or ("",):
        prefix = f"{name}-" if name else ""
        short = ["-o"] if not name else []
        parser.add_argument(
            *short,
            f"--{prefix}option",
            dest=f"{prefix.replace('-', '_')}options",
            action="append",
            default=[],
            type=key_value,
            metavar="KEY=VALUE",
            help=f"storage option for the {name or 'URL'}'s path type (values are parsed as "
            "JSON when they can be: -o anon=true); repeatable",
        )
        parser.add_argument(
            f"--{prefix}path-type",
            dest=f"{prefix.replace('-', '_')}path_type",
            metavar="NAME",
            help="use this path type instead of the one the URL's scheme selects",
        )


def open_storage(url: str, args: argparse.Namespace, name: str = "") -> PathType:
    """The path type instance for ``url`` with the options given for it; a wrong option
    is a :class:`~ckptstore.errors.StorageOptionError` naming it and the fix."""
    attribute = f"{name}_" if name else ""
    flag = f"--{name}-option" if name else "-o"
    options = parse_options(getattr(args, f"{attribute}options", []))
    path_type = getattr(args, f"{attribute}path_type", None)
    return open_with_options(get_registry(), url, path_type, options, flag)


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON on stdout")


def add_progress_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="show a progress bar on stderr (default: when stderr is a terminal)",
    )


def print_json(value: Any) -> None:
    """``value`` as JSON on stdout (the only thing a ``--json`` command prints there)."""
    print(json.dumps(value, indent=2, sort_keys=True))


def format_bytes(count: int | None) -> str:
    """``1536`` → ``'1.5 KiB'``; ``None`` → ``'-'``."""
    if count is None:
        return "-"
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def parse_epochs(values: list[int] | None, committed: list[int], *, latest: bool) -> list[int]:
    """The epochs a command acts on: those given, the newest with ``latest``, else all
    committed ones."""
    if values:
        return sorted(set(values))
    if latest:
        return committed[-1:]
    return committed


EXIT_CODES = {
    EXIT_OK: "success",
    EXIT_ERROR: "error: storage unreachable, unknown plugin, bad option...",
    EXIT_USAGE: "bad command line",
    EXIT_CORRUPT: (
        "corrupt checkpoint: damaged, forged or missing data (any command; the one-line "
        "message names the epoch, node, blob and file)"
    ),
    EXIT_NOT_FOUND: "not found: the epoch or checkpoint asked for is not committed, or nothing "
    "is at the URL",
    EXIT_INTERRUPTED: "interrupted",
}
"""Every exit code of the operator commands and its meaning."""
