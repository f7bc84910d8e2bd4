"""``ckptstore verify URL [--epoch N] [--deep]``: check every stored byte against its
checksum (and, with ``--deep``, every packed archive's ZIP structure)."""

from __future__ import annotations

import argparse
from typing import Any

from ckptstore.cli import _common as common
from ckptstore.tools import NodeCheck, problem_summary, verify_epochs


def register(commands: Any) -> None:
    common.add_command(
        commands,
        "verify",
        run,
        summary="check every byte of committed checkpoints against their checksums",
        description="Re-read committed checkpoints and check every chunk and format file "
        "against the checksum recorded when it was written (CRC-32; CRC-32C in epochs "
        "written before). Exits 3 naming each broken "
        "blob, 4 if the epoch is not committed or is partial (a node's checkpoint is "
        "stored but not in the commit record).",
        arguments=_arguments,
    )


def _arguments(parser: argparse.ArgumentParser) -> None:
    common.add_epoch_selection(parser, "epoch (repeatable; default: all)")
    parser.add_argument(
        "--deep",
        action="store_true",
        help="also check that every packed archive (blobs.zarr.zip, blobs.npz) is a ZIP "
        "that zarr, numpy or zipfile may open safely (names, offsets, sizes, compression "
        "ratios): what cp and convert require",
    )


@common.guarded
def run(args: argparse.Namespace) -> int:
    storage = common.open_storage(args.url, args)
    epochs = common.chosen_epochs(storage, args)
    if not epochs:
        return common.no_committed_epoch(storage, args)
    with common.epochs_progress(storage, epochs, "verify", args) as bar:

        def checked(check: NodeCheck) -> None:
            if not args.json:
                _print_check(check)

        checks = verify_epochs(
            storage, epochs, on_checked=checked, on_bytes=bar.advance, deep=args.deep
        )
    ok = all(check.ok for check in checks)
    if args.json:
        common.print_json(
            {"url": storage.display_url, "ok": ok, "nodes": [c.to_json() for c in checks]}
        )
    elif ok:
        print(f"all {len(checks)} node checkpoint(s) of epochs {epochs} verified")
    if ok:
        return common.EXIT_OK
    if any(check.problems for check in checks):
        return common.EXIT_CORRUPT
    return common.EXIT_NOT_FOUND  # whole where committed, but an epoch is partial


def _print_check(check: NodeCheck) -> None:
    if not check.committed:
        print(
            f"PARTIAL epoch {check.epoch} node {check.node}: stored but not in the epoch's "
            "commit record (the epoch is not committed on every node)"
        )
        return
    if check.ok:
        print(f"ok      epoch {check.epoch} node {check.node}")
        return
    for problem in check.problems:
        print(f"BROKEN  epoch {check.epoch} node {check.node}: {problem_summary(problem)}")
        print(f"        {problem}")
