"""A peer replica's pieces moved from the worker holding them to a restoring worker,
each in one frame of Dask's comm.

Dask's comm cuts a buffer larger than ``distributed.comm.shard`` (64 MiB by default)
into frames, which the receiving worker reads into buffers of their own and then joins
into one by copying them all. A blob of a peer replica larger than that would then be
copied twice on the restore's critical path: once joined, once more into the blob. The
holder (:func:`serve_pieces`, registered where :func:`~ckptstore.dask_session._peers.keep_replica`
keeps a replica) instead answers a request for one piece by writing it in one frame on
that connection only; the receiver (:class:`PieceArrivals`) reads it into one buffer,
which the restore keeps as the blob. Each piece is still a key Dask holds and tracks:
only the message that moves it is ckptstore's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import Future

from distributed import Worker
from distributed.comm.core import Comm
from distributed.core import Status, send_recv
from distributed.protocol.serialize import to_serialize

from ckptstore.dask_session._replica_pieces import ReplicaPiece

__all__ = ["PIECES_IN_FLIGHT", "SERVE_PIECE", "PieceArrivals", "frame_limit", "serve_pieces"]

SERVE_PIECE = "ckptstore_replica_piece"
"""The worker handler answering a request for one replica piece."""

PIECES_IN_FLIGHT = 2
"""Pieces of one replica a restore receives at once (while it checks those arrived)."""


def frame_limit() -> int:
    """The largest buffer Dask's TCP comm sends as one frame in this process
    (``distributed.comm.shard`` when the comm was imported)."""
    from distributed.comm.tcp import TCP

    return max(1, int(TCP.max_shard_size))


def serve_pieces(worker: Worker) -> None:
    """Let other workers fetch the replica pieces ``worker`` holds, each in one frame
    (once per worker)."""
    if SERVE_PIECE in worker.handlers:
        return

    async def serve(comm: Comm, key: str) -> object:
        piece = worker.data.get(key, None)
        if not isinstance(piece, ReplicaPiece):
            return {"status": "missing"}
        message = {"status": "OK", "data": to_serialize(piece)}  # type: ignore[no-untyped-call]
        await _write_in_one_frame(comm, message, piece)
        return Status.dont_reply

    worker.handlers[SERVE_PIECE] = serve


async def _write_in_one_frame(comm: Comm, message: dict[str, object], piece: ReplicaPiece) -> None:
    """Write ``message`` on ``comm`` with ``piece``'s bytes in one frame: the comm's
    frame limit is raised for this message on this connection only."""
    limit = getattr(comm, "max_shard_size", None)
    if not isinstance(limit, int) or limit >= piece.data.nbytes:
        await comm.write(message)  # type: ignore[no-untyped-call]
        return
    comm.max_shard_size = piece.data.nbytes  # type: ignore[attr-defined]
    try:
        await comm.write(message)  # type: ignore[no-untyped-call]
    finally:
        del comm.max_shard_size  # type: ignore[attr-defined]  # back to the class's


class PieceArrivals:
    """The pieces of one replica on their way to ``worker``: fetched in order from
    the workers holding them, ``(address, key)`` each, at most :data:`PIECES_IN_FLIGHT`
    at a time. ``pieces``: a future per piece, done once it arrived."""

    def __init__(self, worker: Worker, sources: Sequence[tuple[str, str]]) -> None:
        gate = asyncio.Semaphore(PIECES_IN_FLIGHT)
        loop = worker.loop.asyncio_loop  # type: ignore[attr-defined]
        self.pieces: list[Future[object]] = [
            asyncio.run_coroutine_threadsafe(_receive(worker, gate, address, key), loop)
            for address, key in sources
        ]

    def cancel(self) -> None:
        for piece in self.pieces:
            piece.cancel()


async def _receive(worker: Worker, gate: asyncio.Semaphore, address: str, key: str) -> object:
    async with gate:
        if address == worker.address:
            return worker.data[key]
        comm = await worker.rpc.connect(address)
        try:
            response = await send_recv(comm, op=SERVE_PIECE, key=key)
        finally:
            worker.rpc.reuse(address, comm)
    if not isinstance(response, dict) or response.get("status") != "OK":
        raise KeyError(f"worker {address} no longer holds the replica piece {key!r}")
    return response.get("data")
