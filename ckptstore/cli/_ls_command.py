"""``ckptstore ls URL``: runs and epochs under a URL, committed or not, with sizes."""

from __future__ import annotations

import argparse
from typing import Any

from ckptstore.cli import _common as common
from ckptstore.plugin import PathType
from ckptstore.protocol import RunEntry, scan


def register(commands: Any) -> None:
    common.add_command(
        commands,
        "ls",
        run,
        summary="list runs and epochs (committed or not) with sizes",
        description="List every checkpoint run under URL (the URL itself, or runs below it), "
        "each epoch's state (committed, partial, uncommitted) and size. Lists the storage. "
        "Exits 4 if nothing is at URL (no such directory, or an empty prefix).",
        urls=(("url", "checkpoint root or a prefix holding several"),),
        arguments=_arguments,
        progress=False,
    )


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", action="store_true", help="show every node checkpoint")
    parser.add_argument(
        "--tier",
        action="append",
        default=[],
        metavar="URL",
        help="a later root of the same job (repeatable): show which roots hold each epoch",
    )
    common.add_storage_options(parser, "tier")  # --tier-option, for every --tier


@common.guarded
def run(args: argparse.Namespace) -> int:
    storage = common.open_storage(args.url, args)
    if args.tier:
        return _tiers(storage, [common.open_storage(url, args, "tier") for url in args.tier], args)
    runs = scan(storage)
    if not runs and not common.location_exists(storage):
        return common.nothing_at(storage, args)
    if args.json:
        common.print_json({"url": storage.display_url, "runs": [run.to_json() for run in runs]})
        return common.EXIT_OK
    if not runs:
        print(f"no checkpoints under {storage.display_url}")
        return common.EXIT_OK
    _print_runs(runs, show_nodes=args.nodes)
    if any(node.default_node for run in runs for epoch in run.epochs for node in epoch.nodes):
        print(common.DEFAULT_NODE_NOTE)
    return common.EXIT_OK


def _print_runs(runs: list[RunEntry], *, show_nodes: bool) -> None:
    for entry in runs:
        print(f"{entry.url}")
        print(f"  {'EPOCH':>6}  {'STATE':<11}  {'NODES':>5}  {'SIZE':>10}  COMMITTED AT")
        for epoch in entry.epochs:
            committed = sum(node.state == "committed" for node in epoch.nodes)
            nodes = f"{committed}/{len(epoch.nodes)}"
            size = common.format_bytes(epoch.stored_bytes)
            when = epoch.committed_at or "-"
            shared = (
                f"  ({common.format_bytes(epoch.stored_bytes - epoch.shared_bytes)} own, "
                f"{common.format_bytes(epoch.shared_bytes)} shared)"
                if epoch.shared_bytes
                else ""
            )
            print(f"  {epoch.epoch:>6}  {epoch.state:<11}  {nodes:>5}  {size:>10}  {when}{shared}")
            if show_nodes:
                for node in epoch.nodes:
                    mark = f"  {common.DEFAULT_NODE_MARK}" if node.default_node else ""
                    print(
                        f"  {'':>6}    {node.node:<24} {node.state:<11} "
                        f"{node.db_type or '-':<6} "
                        f"{common.format_bytes(node.stored_bytes):>10}{mark}"
                    )


def _states(storage: PathType) -> dict[int, str]:
    """Each epoch's state in the run at ``storage`` itself."""
    runs = [entry for entry in scan(storage) if entry.prefix == ""]
    return {epoch.epoch: epoch.state for run in runs for epoch in run.epochs}


def _tiers(first: PathType, later: list[PathType], args: argparse.Namespace) -> int:
    """Which roots of a tiered job hold each epoch (fastest first)."""
    roots = [first, *later]
    states = [_states(storage) for storage in roots]
    if not any(states) and not common.location_exists(first):
        return common.nothing_at(first, args)
    epochs = sorted({epoch for found in states for epoch in found})
    if args.json:
        common.print_json(
            {
                "roots": [storage.display_url for storage in roots],
                "epochs": [
                    {
                        "epoch": epoch,
                        "roots": {
                            storage.display_url: found.get(epoch)
                            for storage, found in zip(roots, states, strict=True)
                        },
                    }
                    for epoch in epochs
                ],
            }
        )
        return common.EXIT_OK
    width = max(11, *(len(storage.display_url) for storage in roots))
    print(f"  {'EPOCH':>6}  " + "  ".join(f"{s.display_url:<{width}}" for s in roots).rstrip())
    for epoch in epochs:
        cells = "  ".join(f"{found.get(epoch, '-'):<{width}}" for found in states)
        print(f"  {epoch:>6}  {cells.rstrip()}")
    return common.EXIT_OK
