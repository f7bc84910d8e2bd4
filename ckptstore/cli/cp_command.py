"""``ckptstore cp SRC DST``: copy committed epochs between any two storages, verified."""

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
    format_bytes,
    guarded,
    open_storage,
    parse_epochs,
    print_json,
)
from ckptstore.cli._progress import ProgressBar
from ckptstore.inventory import committed_epochs
from ckptstore.replication import NodeDone, copy_epochs


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "cp",
        help="copy committed epochs to another root (any storage to any other), verified",
        description="Copy committed epochs from SRC to DST through the commit protocol: "
        "nodes are copied in parallel, every byte is checked against its CRC-32C, the "
        "copy is verified, and the epoch is committed at DST last. Nodes already at DST "
        "with the same manifest are skipped, so an interrupted copy resumes.",
    )
    parser.add_argument("src", help="source checkpoint root")
    parser.add_argument("dst", help="destination checkpoint root")
    parser.add_argument("--epoch", type=int, action="append", help="epoch (repeatable)")
    parser.add_argument("--latest", action="store_true", help="only the newest committed epoch")
    parser.add_argument("--jobs", type=int, default=4, help="nodes copied at once (default 4)")
    parser.add_argument("--force", action="store_true", help="copy nodes already at DST too")
    parser.add_argument(
        "--no-verify", dest="verify", action="store_false", help="skip reading the copy back"
    )
    add_json_flag(parser)
    add_progress_flag(parser)
    add_storage_options(parser, "src", "dst")
    parser.set_defaults(run=run)


@guarded
def run(args: argparse.Namespace) -> int:
    source = open_storage(args.src, args, "src")
    dest = open_storage(args.dst, args, "dst")
    epochs = parse_epochs(args.epoch, committed_epochs(source), latest=args.latest)
    if not epochs:
        print(f"ckptstore: no committed epoch under {source.display_url}")
        return EXIT_NOT_FOUND
    total = sum(
        node.stored_bytes for e in epochs for node in require_commit(source, e).nodes.values()
    )
    with ProgressBar(total, "copy", enabled=args.progress) as bar:

        def copied(done: NodeDone) -> None:
            bar.advance(done.stored_bytes)

        done = copy_epochs(
            source,
            dest,
            epochs,
            jobs=args.jobs,
            verify=args.verify,
            force=args.force,
            on_done=copied,
        )
    copied_nodes = [d for d in done if not d.skipped]
    if args.json:
        print_json(
            {
                "src": source.display_url,
                "dst": dest.display_url,
                "epochs": epochs,
                "copied": [vars(d) for d in copied_nodes],
                "skipped": [vars(d) for d in done if d.skipped],
            }
        )
        return EXIT_OK
    size = format_bytes(sum(d.stored_bytes for d in copied_nodes))
    print(
        f"copied {len(copied_nodes)} node checkpoint(s) ({size}) of epochs {epochs} to "
        f"{dest.display_url}; {len(done) - len(copied_nodes)} already there"
    )
    return EXIT_OK
