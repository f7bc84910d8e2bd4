"""``ckptstore lease show URL`` and ``ckptstore lease break URL --node NODE``: who holds
each node's writer lease, and breaking one whose holder an operator knows is gone (or
must stop) so that a new job may start at once."""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime
from typing import Any

from ckptstore.cli import _common as common
from ckptstore.errors import CorruptCheckpointError
from ckptstore.plugin import PathType
from ckptstore.protocol import LeaseHolder, break_lease, read_lease_document
from ckptstore.records import LEASE_DIR


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "lease",
        help="show or break the writer leases of a checkpoint root",
        description="Each node a job saves is leased to that job while it runs, so two "
        "jobs never write one node at once. `lease show` lists each node's lease; "
        "`lease break` frees one at once.",
    )
    actions = parser.add_subparsers(dest="lease_action", required=True, metavar="ACTION")
    common.add_command(
        actions,
        "show",
        show,
        summary="each node's lease holder: host, pid, start, expiry",
        description="Each node's writer lease: free, or held by a job (its host, pid, "
        "start time, last renewal, expiry and generation). A lease past its expiry belongs "
        "to a job that is gone: the next job takes it over by itself.",
        progress=False,
    )
    common.add_command(
        actions,
        "break",
        break_,
        summary="free a node's lease at once",
        description="Free the writer lease of NODE at once, without asking: a new job may "
        "start on that node right away, and the job that held it, if it is still alive, "
        "can no longer commit (its next save or commit stops it with LeaseLostError).",
        arguments=_break_arguments,
        progress=False,
    )


def _break_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--node", action="append", required=True, metavar="NODE", help="repeatable")


@common.guarded
def show(args: argparse.Namespace) -> int:
    storage = common.open_storage(args.url, args)
    if not common.location_exists(storage):
        return common.nothing_at(storage, args)
    rows = [_row(storage, node) for node in _leased_nodes(storage)]
    if args.json:
        common.print_json({"url": storage.display_url, "leases": rows})
    elif not rows:
        print(f"no writer lease under {storage.display_url}")
    else:
        width = max(len(row["node"]) for row in rows)
        for row in rows:
            print(f"{row['node']:<{width}}  {_describe(row)}")
    if any(row["state"] == "unreadable" for row in rows):
        return common.EXIT_CORRUPT
    return common.EXIT_OK


@common.guarded
def break_(args: argparse.Namespace) -> int:
    storage = common.open_storage(args.url, args)
    results = []
    for node in args.node:
        try:
            before = read_lease_document(storage, node)
        except CorruptCheckpointError:
            before = None  # broken all the same: the next job takes a fresh generation
        broken = break_lease(storage, node)
        after = read_lease_document(storage, node)
        results.append(
            {
                "node": node,
                "had_lease": after is not None,
                "was_held": broken is not None,
                "holder": _holder_json(broken) if broken is not None else None,
                "generation": after.generation if after is not None else None,
                "previous_generation": before.generation if before is not None else None,
            }
        )
    if args.json:
        common.print_json({"url": storage.display_url, "broken": results})
    else:
        for result in results:
            print(_broke(result))
    if not all(result["had_lease"] for result in results):
        return common.EXIT_NOT_FOUND
    return common.EXIT_OK


def _leased_nodes(storage: PathType) -> list[str]:
    prefix = f"{LEASE_DIR}/"
    return sorted(
        key[len(prefix) : -len(".json")]
        for key in storage.list_keys(LEASE_DIR)
        if key.startswith(prefix) and key.endswith(".json") and "/" not in key[len(prefix) :]
    )


def _row(storage: PathType, node: str) -> dict[str, Any]:
    try:
        holder = read_lease_document(storage, node)
    except CorruptCheckpointError as error:
        return {"node": node, "state": "unreadable", "error": " ".join(str(error).split())}
    if holder is None:
        return {"node": node, "state": "released"}  # deleted since the listing
    return {"node": node, "state": holder.state, **_holder_json(holder)}


def _holder_json(holder: LeaseHolder) -> dict[str, Any]:
    renewed = holder.started_at if holder.renewed_at is None else holder.renewed_at
    return {
        "host": holder.host,
        "pid": holder.pid,
        "generation": holder.generation,
        "started_at": _iso(holder.started_at),
        "renewed_at": _iso(renewed),
        "expires_at": _iso(holder.expires_at),
        "expired": holder.held and time.time() >= holder.expires_at,
        "gone": holder.held and holder.gone(time.time()),
    }


def _describe(row: dict[str, Any]) -> str:
    state = row["state"]
    if state == "unreadable":
        return f"unreadable lease ({row['error']}); the next job takes it over"
    if state == "released":
        generation = f", generation {row['generation']}" if "generation" in row else ""
        return f"free (released{generation})"
    if state == "broken":
        return f"free (broken from host {row['host']}, generation {row['generation']})"
    expired = " (its job is gone: the next job takes it over)" if row["gone"] else ""
    return (
        f"held by host {row['host']}, pid {row['pid']}, started {row['started_at']}, "
        f"renewed {row['renewed_at']}, valid until {row['expires_at']}, generation "
        f"{row['generation']}{expired}"
    )


def _broke(result: dict[str, Any]) -> str:
    node = result["node"]
    if not result["had_lease"]:
        return f"{node}: no writer lease (nothing to break); check the node name"
    if not result["was_held"]:
        return f"{node}: the lease was free; it is now at generation {result['generation']}"
    holder = result["holder"]
    return (
        f"{node}: broke the lease of host {holder['host']}, pid {holder['pid']} (generation "
        f"{result['previous_generation']}, now {result['generation']}): a new job may start "
        "now, and that job, if alive, can no longer commit"
    )


def _iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="seconds")
