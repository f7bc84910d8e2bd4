"""``ckptstore gc URL --keep-last N [--keep-every K] [--node NAME]... [--dry-run]``:
delete old epochs (only the given nodes' checkpoints with ``--node``), and the save
attempts no commit record names once their node and epoch is committed to another."""

from __future__ import annotations

import argparse
from typing import Any

from ckptstore.builtin import CATALOG_DIR, JsonCatalog
from ckptstore.checkpoint import KeepLast, carry_out, plan_retention
from ckptstore.cli import _common as common
from ckptstore.cli._parser import at_least
from ckptstore.cli._progress import ProgressBar
from ckptstore.io import CHUNK_STORE_DIR
from ckptstore.plugin import PathType
from ckptstore.protocol import collect_chunks, collect_garbage, find_garbage


def register(commands: Any) -> None:
    common.add_command(
        commands,
        "gc",
        run,
        summary="delete committed epochs a retention policy lets go",
        description="Keep the newest N committed epochs (and every K-th), delete the other "
        "committed ones: the nodes are retracted from the commit record first, then exactly "
        "their checkpoints are deleted. With --node, only those nodes' checkpoints are "
        "considered and deleted (a job's share of a prefix); an epoch's commit record goes "
        "only when no node remains in it. Then the save attempts no commit record names "
        "are deleted where their node and epoch is committed to another attempt (lost "
        "races, crashed or replaced saves). Uncommitted epochs and saves in progress are "
        "never touched. Last, the chunks of incremental saves (<root>/_ckptstore/chunks) "
        "that no committed epoch of any job and no save in flight refers to are freed. "
        "--dry-run lists what would go and deletes nothing.",
        arguments=_arguments,
    )


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--keep-last", type=at_least(1), required=True, metavar="N")
    parser.add_argument(
        "--keep-every", type=at_least(1), metavar="K", help="also keep epochs %% K == 0"
    )
    parser.add_argument(
        "--node",
        action="append",
        metavar="NAME",
        help="delete only this node's checkpoints (repeatable; default: every node)",
    )
    parser.add_argument("--dry-run", action="store_true", help="only show what would be deleted")


@common.guarded
def run(args: argparse.Namespace) -> int:
    storage = common.open_storage(args.url, args)
    if not common.location_exists(storage):
        return common.nothing_at(storage, args)
    policy = KeepLast(args.keep_last, every=args.keep_every)
    plan = plan_retention(storage, policy, nodes=args.node)
    if not args.dry_run:
        with ProgressBar(plan.freed_bytes, "gc", enabled=args.progress) as bar:
            carry_out(storage, plan, handler=_json_catalog(storage), on_bytes=bar.advance)
    garbage = find_garbage(storage, args.node)
    if not args.dry_run:
        collect_garbage(storage, garbage)
    chunks = None
    if storage.list_keys(CHUNK_STORE_DIR):
        deleting = [(r.epoch, node) for r in plan.delete for node in r.nodes]
        chunks = collect_chunks(storage, dry_run=args.dry_run, deleting=deleting)
    if args.json:
        shown = {
            **plan.to_json(),
            "garbage": [item.to_json() for item in garbage],
            "dry_run": args.dry_run,
        }
        if chunks is not None:
            shown["chunks"] = chunks.to_json()
        common.print_json(shown)
        return common.EXIT_OK
    verb = "would delete" if args.dry_run else "deleted"
    for removal in plan.delete:
        print(
            f"{verb} epoch {removal.epoch} (node(s) {', '.join(removal.nodes) or '-'}, "
            f"{common.format_bytes(removal.stored_bytes)})"
        )
    for item in garbage:
        print(f"{verb} {item.key} ({item.reason}, {common.format_bytes(item.stored_bytes)})")
    print(
        f"{verb} {len(plan.delete)} epoch(s), {common.format_bytes(plan.freed_bytes)}; kept "
        f"{list(plan.keep)}"
    )
    if garbage:
        freed = sum(item.stored_bytes for item in garbage)
        print(f"{verb} {len(garbage)} uncommitted attempt(s), {common.format_bytes(freed)}")
    if chunks is not None:
        verb = "would free" if args.dry_run else "freed"
        print(
            f"{verb} {len(chunks.freed)} of {chunks.listed} shared chunk(s), "
            f"{common.format_bytes(chunks.freed_bytes)}"
            + (f"; {len(chunks.intents)} save(s) in flight keep theirs" if chunks.intents else "")
        )
    return common.EXIT_OK


def _json_catalog(storage: PathType) -> JsonCatalog | None:
    """The root's json catalog, if it has one, so that it forgets what gc deleted."""
    if not storage.list_keys(CATALOG_DIR):
        return None
    catalog = JsonCatalog()
    catalog.set_params(storage.display_url, "", [], storage=storage)
    return catalog
