"""``ckptstore gc URL --keep-last N [--keep-every K] [--dry-run]``: delete old epochs."""

from __future__ import annotations

import argparse
from typing import Any

from ckptstore.checkpoint._retention import EpochRemoval, KeepLast, enforce, plan_retention
from ckptstore.cli import _common as common
from ckptstore.cli._progress import ProgressBar


def register(commands: Any) -> None:
    common.add_command(
        commands,
        "gc",
        run,
        summary="delete committed epochs a retention policy lets go",
        description="Keep the newest N committed epochs (and every K-th), delete the other "
        "committed ones: commit record first, then exactly the node checkpoints it lists. "
        "Uncommitted epochs and saves in progress are never touched.",
        arguments=_arguments,
    )


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--keep-last", type=int, required=True, metavar="N")
    parser.add_argument("--keep-every", type=int, metavar="K", help="also keep epochs %% K == 0")
    parser.add_argument("--dry-run", action="store_true", help="only show what would be deleted")


@common.guarded
def run(args: argparse.Namespace) -> int:
    storage = common.open_storage(args.url, args)
    policy = KeepLast(args.keep_last, every=args.keep_every)
    planned = plan_retention(storage, policy)
    if args.dry_run:
        plan = planned
    else:
        with ProgressBar(len(planned.delete), "gc", unit="epochs", enabled=args.progress) as bar:

            def removed(removal: EpochRemoval) -> None:
                bar.advance()

            plan = enforce(storage, policy, on_removed=removed)
    if args.json:
        common.print_json({**plan.to_json(), "dry_run": args.dry_run})
        return common.EXIT_OK
    verb = "would delete" if args.dry_run else "deleted"
    for removal in plan.delete:
        print(
            f"{verb} epoch {removal.epoch} ({len(removal.nodes)} node(s), "
            f"{common.format_bytes(removal.stored_bytes)})"
        )
    print(
        f"{verb} {len(plan.delete)} epoch(s), {common.format_bytes(plan.freed_bytes)}; kept "
        f"{list(plan.keep)}"
    )
    return common.EXIT_OK
