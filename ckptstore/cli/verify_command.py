"""``ckptstore verify URL [--epoch N]``: check every stored byte against its CRC-32C."""

from __future__ import annotations

import argparse
from typing import Any

from ckptstore.checking import NodeCheck, problem_summary, require_commit, verify_epochs
from ckptstore.cli._common import (
    EXIT_CORRUPT,
    EXIT_NOT_FOUND,
    EXIT_OK,
    add_json_flag,
    add_progress_flag,
    add_storage_options,
    guarded,
    open_storage,
    parse_epochs,
    print_json,
)
from ckptstore.cli._progress import ProgressBar
from ckptstore.inventory import committed_epochs


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "verify",
        help="check every byte of committed checkpoints against their checksums",
        description="Re-read committed checkpoints and check every chunk and format file "
        "against the CRC-32C recorded when it was written. Exits 3 naming each broken "
        "blob, 4 if the epoch is not committed.",
    )
    parser.add_argument("url", help="checkpoint root")
    parser.add_argument(
        "--epoch", type=int, action="append", help="epoch (repeatable; default: all)"
    )
    parser.add_argument("--latest", action="store_true", help="only the newest committed epoch")
    add_json_flag(parser)
    add_progress_flag(parser)
    add_storage_options(parser)
    parser.set_defaults(run=run)


@guarded
def run(args: argparse.Namespace) -> int:
    storage = open_storage(args.url, args)
    epochs = parse_epochs(args.epoch, committed_epochs(storage), latest=args.latest)
    if not epochs:
        print(f"ckptstore: no committed epoch under {storage.display_url}")
        return EXIT_NOT_FOUND
    total = sum(record.nbytes for record in (require_commit(storage, e) for e in epochs))
    with ProgressBar(total, "verify", enabled=args.progress) as bar:

        def checked(check: NodeCheck) -> None:
            bar.advance(check.stored_bytes)
            if not args.json:
                _print_check(check)

        checks = verify_epochs(storage, epochs, on_checked=checked)
    ok = all(check.ok for check in checks)
    if args.json:
        print_json({"url": storage.display_url, "ok": ok, "nodes": [c.to_json() for c in checks]})
    elif ok:
        print(f"all {len(checks)} node checkpoint(s) of epochs {epochs} verified")
    return EXIT_OK if ok else EXIT_CORRUPT


def _print_check(check: NodeCheck) -> None:
    if check.ok:
        print(f"ok      epoch {check.epoch} node {check.node}")
        return
    for problem in check.problems:
        print(f"BROKEN  epoch {check.epoch} node {check.node}: {problem_summary(problem)}")
        print(f"        {problem}")
