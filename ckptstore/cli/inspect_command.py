"""``ckptstore inspect URL --epoch N``: nodes, blobs, dtypes, shapes and bytes."""

from __future__ import annotations

import argparse
from typing import Any

from ckptstore.checking import describe_epoch
from ckptstore.cli._common import (
    EXIT_NOT_FOUND,
    EXIT_OK,
    add_json_flag,
    add_storage_options,
    format_bytes,
    guarded,
    open_storage,
    print_json,
)
from ckptstore.inventory import committed_epochs


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "inspect",
        help="show an epoch's nodes and blobs (dtype, shape, bytes)",
        description="Describe a committed epoch from its manifests (no blob data is read).",
    )
    parser.add_argument("url", help="checkpoint root")
    parser.add_argument(
        "--epoch", type=int, help="epoch to inspect (default: the newest committed)"
    )
    parser.add_argument("--node", action="append", help="only this node (repeatable)")
    add_json_flag(parser)
    add_storage_options(parser)
    parser.set_defaults(run=run)


@guarded
def run(args: argparse.Namespace) -> int:
    storage = open_storage(args.url, args)
    epoch = args.epoch
    if epoch is None:
        committed = committed_epochs(storage)
        if not committed:
            print(f"ckptstore: no committed epoch under {storage.display_url}")
            return EXIT_NOT_FOUND
        epoch = committed[-1]
    description = describe_epoch(storage, epoch, args.node)
    if args.json:
        print_json(description)
        return EXIT_OK
    print(
        f"{description['url']}  epoch {epoch}  committed {description['committed_at']}  "
        f"{format_bytes(description['nbytes'])} in {len(description['nodes'])} node(s)"
    )
    for node in description["nodes"]:
        print(
            f"  node {node['node']}  {node['db_type']}  {len(node['blobs'])} blobs  "
            f"{format_bytes(node['nbytes'])} ({format_bytes(node['stored_bytes'])} stored)"
        )
        for blob in node["blobs"]:
            shape = (
                "("
                + ", ".join(map(str, blob["shape"]))
                + ("," if len(blob["shape"]) == 1 else "")
                + ")"
            )
            print(
                f"    {blob['name']:<40} {blob['dtype']:<8} {shape:<16} "
                f"{format_bytes(blob['nbytes']):>10}  {blob['chunks']} chunk(s)"
            )
    return EXIT_OK
