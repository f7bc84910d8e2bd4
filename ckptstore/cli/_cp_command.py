"""``ckptstore cp SRC DST``: copy committed epochs between any two storages, verified."""

from __future__ import annotations

import argparse
from typing import Any

from ckptstore.cli import _common as common
from ckptstore.cli._parser import at_least
from ckptstore.tools import CONVERT_PASSES, convert_epochs, copy_epochs, copy_passes


def register(commands: Any) -> None:
    common.add_command(
        commands,
        "cp",
        run,
        summary="copy committed epochs to another root (any storage to any other), verified",
        description="Copy committed epochs from SRC to DST through the commit protocol: "
        "nodes are copied in parallel, every byte is checked against its checksum, the "
        "copy is verified, and the epoch is committed at DST last. Nodes already at DST "
        "with the same manifest are skipped, so an interrupted copy resumes.",
        urls=(("src", "source checkpoint root"), ("dst", "destination checkpoint root")),
        arguments=_arguments,
    )


def _arguments(parser: argparse.ArgumentParser) -> None:
    common.add_epoch_selection(parser, "epoch (repeatable)")
    parser.add_argument(
        "--jobs", type=at_least(1), default=4, help="nodes copied at once (default 4)"
    )
    parser.add_argument("--force", action="store_true", help="copy nodes already at DST too")
    parser.add_argument(
        "--no-verify", dest="verify", action="store_false", help="skip reading the copy back"
    )
    parser.add_argument(
        "--materialize",
        action="store_true",
        help="write each node self-contained, in its format (incremental epochs' shared "
        "chunks copied into its own files: plain zarr/numpy read it)",
    )


@common.guarded
def run(args: argparse.Namespace) -> int:
    source = common.open_storage(args.src, args, "src")
    dest = common.open_storage(args.dst, args, "dst")
    epochs = common.chosen_epochs(source, args)
    if not epochs:
        return common.no_committed_epoch(source, args)
    if args.materialize:
        with common.epochs_progress(
            source, epochs, "materialize", args, passes=CONVERT_PASSES
        ) as bar:
            written = convert_epochs(source, epochs, None, dest=dest, on_bytes=bar.advance)
        if args.json:
            common.print_json(
                {
                    "src": source.display_url,
                    "dst": dest.display_url,
                    "materialized": [
                        {"node": d.node, "epoch": d.epoch, "stored_bytes": d.stored_bytes}
                        for d in written
                    ],
                }
            )
            return common.EXIT_OK
        print(
            f"wrote {len(written)} self-contained node checkpoint(s) of epochs "
            f"{sorted({d.epoch for d in written})} to {dest.display_url}"
        )
        return common.EXIT_OK
    label = "copy and verify" if args.verify else "copy"
    passes = copy_passes(args.verify)
    with common.epochs_progress(source, epochs, label, args, passes=passes) as bar:
        done = copy_epochs(
            source,
            dest,
            epochs,
            jobs=args.jobs,
            verify=args.verify,
            force=args.force,
            on_bytes=bar.advance,
        )
    copied_nodes = [d for d in done if not d.skipped]
    if args.json:
        common.print_json(
            {
                "src": source.display_url,
                "dst": dest.display_url,
                "epochs": epochs,
                "copied": [vars(d) for d in copied_nodes],
                "skipped": [vars(d) for d in done if d.skipped],
            }
        )
        return common.EXIT_OK
    size = common.format_bytes(sum(d.stored_bytes for d in copied_nodes))
    print(
        f"copied {len(copied_nodes)} node checkpoint(s) ({size}) of epochs {epochs} to "
        f"{dest.display_url}; {len(done) - len(copied_nodes)} already there"
    )
    return common.EXIT_OK
