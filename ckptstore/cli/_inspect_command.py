"""``ckptstore inspect URL --epoch N``: nodes, blobs, dtypes, shapes and bytes; for a
DCP epoch also each tensor's global shape and saved chunks (offsets, sizes, rank)."""

from __future__ import annotations

import argparse
from typing import Any

from ckptstore.cli import _common as common
from ckptstore.tools import DcpTensor, describe_dcp, describe_epoch


def register(commands: Any) -> None:
    common.add_command(
        commands,
        "inspect",
        run,
        summary="show an epoch's nodes and blobs (dtype, shape, bytes, chunks, codec)",
        description="Describe a committed epoch from its manifests (no blob data is read).",
        arguments=_arguments,
        progress=False,
    )


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--epoch",
        type=common.epoch_argument,
        help="epoch to inspect (default: the newest committed)",
    )
    parser.add_argument("--node", action="append", help="only this node (repeatable)")


@common.guarded
def run(args: argparse.Namespace) -> int:
    storage = common.open_storage(args.url, args)
    epoch = args.epoch
    if epoch is None:
        committed = common.committed(storage)
        if not committed:
            return common.no_committed_epoch(storage, args)
        epoch = committed[-1]
    description = describe_epoch(storage, epoch, args.node)
    sharded = describe_dcp(storage, epoch)
    if args.json:
        common.print_json(description if sharded is None else {**description, "dcp": sharded})
        return common.EXIT_OK
    print(
        f"{description['url']}  epoch {epoch}  committed {description['committed_at']}  "
        f"{common.format_bytes(description['nbytes'])} in {len(description['nodes'])} node(s)"
    )
    for node in description["nodes"]:
        mark = f" {common.DEFAULT_NODE_MARK}" if node["default_node"] else ""
        print(
            f"  node {node['node']}{mark}  {node['db_type']}  {len(node['blobs'])} blobs  "
            f"{common.format_bytes(node['nbytes'])} "
            f"({common.format_bytes(node['stored_bytes'])} stored"
            + (
                f": {common.format_bytes(node['stored_bytes'] - node['shared_bytes'])} own, "
                f"{common.format_bytes(node['shared_bytes'])} in shared chunks)"
                if node["shared_bytes"]
                else ")"
            )
        )
        if node["blobs"]:
            print(
                f"    {'BLOB':<40} {'DTYPE':<8} {'SHAPE':<16} {'BYTES':>10}  {'CHUNKS':>6}  CODEC"
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
                f"{common.format_bytes(blob['nbytes']):>10}  {blob['chunks']:>6}  {blob['codec']}"
            )
    if any(node["default_node"] for node in description["nodes"]):
        print(common.DEFAULT_NODE_NOTE)
    if sharded is not None:
        _print_dcp(sharded)
    return common.EXIT_OK


def _print_dcp(tensors: list[DcpTensor]) -> None:
    """Each DCP tensor's global shape and its saved chunks (offsets, sizes, rank node)."""
    print(f"  DCP tensors ({len(tensors)}): global shape, then each saved chunk")
    for tensor in tensors:
        print(f"    {tensor['key']:<40} {tensor['dtype']:<8} {_shape(tensor['shape'])}")
        for chunk in tensor["chunks"]:
            print(
                f"      at {_shape(chunk['offsets']):<16} size {_shape(chunk['sizes']):<16} "
                f"in {chunk['node']}"
            )


def _shape(values: list[int]) -> str:
    return "(" + ", ".join(map(str, values)) + ("," if len(values) == 1 else "") + ")"
