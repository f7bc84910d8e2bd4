"""``ckptstore ls URL``: runs and epochs under a URL, committed or not, with sizes."""

from __future__ import annotations

import argparse
from typing import Any

from ckptstore.cli._common import (
    EXIT_OK,
    add_json_flag,
    add_storage_options,
    format_bytes,
    guarded,
    open_storage,
    print_json,
)
from ckptstore.inventory import scan


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "ls",
        help="list runs and epochs (committed or not) with sizes",
        description="List every checkpoint run under URL (the URL itself, or runs below it), "
        "each epoch's state (committed, partial, uncommitted) and size. Lists the storage.",
    )
    parser.add_argument("url", help="checkpoint root or a prefix holding several")
    parser.add_argument("--nodes", action="store_true", help="show every node checkpoint")
    add_json_flag(parser)
    add_storage_options(parser)
    parser.set_defaults(run=run)


@guarded
def run(args: argparse.Namespace) -> int:
    storage = open_storage(args.url, args)
    runs = scan(storage)
    if args.json:
        print_json({"url": storage.display_url, "runs": [run.to_json() for run in runs]})
        return EXIT_OK
    if not runs:
        print(f"no checkpoints under {storage.display_url}")
        return EXIT_OK
    for entry in runs:
        print(f"{entry.url}")
        print(f"  {'EPOCH':>6}  {'STATE':<11}  {'NODES':>5}  {'SIZE':>10}  COMMITTED AT")
        for epoch in entry.epochs:
            committed = sum(node.state == "committed" for node in epoch.nodes)
            nodes = f"{committed}/{len(epoch.nodes)}"
            size = format_bytes(epoch.stored_bytes)
            when = epoch.committed_at or "-"
            print(f"  {epoch.epoch:>6}  {epoch.state:<11}  {nodes:>5}  {size:>10}  {when}")
            if args.nodes:
                for node in epoch.nodes:
                    print(
                        f"  {'':>6}    {node.node:<24} {node.state:<11} "
                        f"{node.db_type or '-':<6} {format_bytes(node.stored_bytes):>10}"
                    )
    return EXIT_OK
