"""``ckptstore convert URL --to FORMAT``: rewrite committed epochs in another format."""

from __future__ import annotations

import argparse
from typing import Any

from ckptstore.checking import require_commit
from ckptstore.cli._common import (
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
from ckptstore.plugin.registry import get_registry
from ckptstore.replication import NodeDone, convert_epochs


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "convert",
        help="rewrite committed epochs in another format (zarr, npz, lmdb...)",
        description="Read committed epochs (verified) and write them again in another DB "
        "type, in place or into --dest. In place, an epoch is briefly uncommitted while "
        "its nodes are rewritten; if a rewrite fails the original is written back.",
    )
    parser.add_argument("url", help="checkpoint root")
    parser.add_argument("--to", required=True, metavar="FORMAT", help="target DB type")
    parser.add_argument("--epoch", type=int, action="append", help="epoch (repeatable)")
    parser.add_argument("--latest", action="store_true", help="only the newest committed epoch")
    parser.add_argument("--dest", help="write the converted epochs under this root instead")
    add_json_flag(parser)
    add_progress_flag(parser)
    add_storage_options(parser)
    parser.set_defaults(run=run)


@guarded
def run(args: argparse.Namespace) -> int:
    target_type = get_registry().db_type(args.to)
    storage = open_storage(args.url, args)
    dest = open_storage(args.dest, args) if args.dest else None
    epochs = parse_epochs(args.epoch, committed_epochs(storage), latest=args.latest)
    if not epochs:
        print(f"ckptstore: no committed epoch under {storage.display_url}")
        return EXIT_NOT_FOUND
    nodes = sum(len(require_commit(storage, epoch).nodes) for epoch in epochs)
    with ProgressBar(
        nodes, f"convert to {target_type.name}", unit="nodes", enabled=args.progress
    ) as bar:

        def converted(done: NodeDone) -> None:
            bar.advance()

        done = convert_epochs(storage, epochs, target_type, dest=dest, on_done=converted)
    rewritten = [d for d in done if not d.skipped]
    if args.json:
        print_json(
            {
                "url": (dest or storage).display_url,
                "to": target_type.name,
                "converted": [vars(d) for d in rewritten],
                "skipped": [vars(d) for d in done if d.skipped],
            }
        )
        return EXIT_OK
    print(
        f"converted {len(rewritten)} node checkpoint(s) of epochs {epochs} to "
        f"{target_type.name}; {len(done) - len(rewritten)} already were"
    )
    return EXIT_OK
