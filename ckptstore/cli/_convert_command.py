"""``ckptstore convert URL --to FORMAT``: rewrite committed epochs in another format."""

from __future__ import annotations

import argparse
from typing import Any

from ckptstore.cli import _common as common
from ckptstore.plugin import get_registry
from ckptstore.tools import CONVERT_PASSES, convert_epochs


def register(commands: Any) -> None:
    common.add_command(
        commands,
        "convert",
        run,
        summary="rewrite committed epochs in another format (zarr, npz, lmdb...)",
        description="Read committed epochs (verified) and write them again in another DB "
        "type, in place or into --dest. In place, an epoch is briefly uncommitted while "
        "its nodes are rewritten; if a rewrite fails the original is written back.",
        arguments=_arguments,
    )


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--to", required=True, metavar="FORMAT", help="target DB type")
    common.add_epoch_selection(parser, "epoch (repeatable)")
    parser.add_argument("--dest", help="write the converted epochs under this root instead")


@common.guarded
def run(args: argparse.Namespace) -> int:
    target_type = get_registry().db_type(args.to)
    storage = common.open_storage(args.url, args)
    dest = common.open_storage(args.dest, args) if args.dest else None
    epochs = common.chosen_epochs(storage, args)
    if not epochs:
        return common.no_committed_epoch(storage, args)
    label = f"convert to {target_type.name}"
    with common.epochs_progress(storage, epochs, label, args, passes=CONVERT_PASSES) as bar:
        done = convert_epochs(storage, epochs, target_type, dest=dest, on_bytes=bar.advance)
    rewritten = [d for d in done if not d.skipped]
    if args.json:
        common.print_json(
            {
                "url": (dest or storage).display_url,
                "to": target_type.name,
                "converted": [vars(d) for d in rewritten],
                "skipped": [vars(d) for d in done if d.skipped],
            }
        )
        return common.EXIT_OK
    print(
        f"converted {len(rewritten)} node checkpoint(s) of epochs {epochs} to "
        f"{target_type.name}; {len(done) - len(rewritten)} already were"
    )
    return common.EXIT_OK
