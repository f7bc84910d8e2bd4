"""How a replica is cut into pieces: joined only where it must be, and a layout whose
segments leave their pieces refused."""

from __future__ import annotations

from concurrent.futures import Future

import numpy as np

from ckptstore.dask_session._replica_pieces import (
    ReplicaLayout,
    ReplicaPiece,
    carve,
    cut_into_segments,
    replica_pieces,
)
from ckptstore.dask_session._replica_storage import ArrivingPiece, NodeReplica

NODE = "trainer_0"
EPOCH = 2


def arriving(piece: ReplicaPiece) -> ArrivingPiece:
    arrival: Future[object] = Future()
    arrival.set_result(piece)
    return ArrivingPiece("peer replica", "k", piece.data.nbytes, arrival, timeout=600.0)


def test_carving_anew_joins_only_the_pieces_that_straddle() -> None:
    first, second = np.arange(6, dtype=np.uint8), np.arange(6, 12, dtype=np.uint8)
    carved = carve([first, second], [3, 8, 12])
    assert [piece.tolist() for piece in carved] == [[0, 1, 2], [3, 4, 5, 6, 7], [8, 9, 10, 11]]
    assert np.shares_memory(carved[0], first)
    assert np.shares_memory(carved[2], second)
    assert not np.shares_memory(carved[1], first)
    assert not np.shares_memory(carved[1], second)


def test_a_layout_whose_segments_leave_their_pieces_is_refused() -> None:
    good = ReplicaLayout("root", NODE, EPOCH, (4, 2), {"k": ((0, 0, 2), (1, 0, 2), (0, 2, 4))})
    assert good.valid()
    assert not ReplicaLayout("root", NODE, EPOCH, (4, 2), {"k": ((0, 0, 5), (1, 0, 2))}).valid()
    assert not ReplicaLayout("root", NODE, EPOCH, (4, 2), {"k": ((0, 0, 4),)}).valid()  # unused
    assert not ReplicaLayout("root", NODE, EPOCH, (4,), {"k": ((1, 0, 4),)}).valid()


def test_forged_runs_that_overlap_or_reach_past_the_object_travel_as_other_bytes() -> None:
    """A manifest naming one range for a thousand blobs must not make a peer gather the
    range a thousand times: each byte travels once, and the object reads back whole."""
    data = np.arange(100, dtype=np.uint8)
    forged = (*(((0, 100),) for _ in range(1000)), ((90, 20),))
    replica = NodeReplica("root", NODE, EPOCH, {"k": (data,)}, {"k": forged})
    layout, pieces = replica_pieces(replica, 64)
    assert layout.valid()
    assert sum(layout.pieces) == 100
    objects = layout.objects([arriving(piece) for piece in pieces])
    assert np.concatenate([part.data() for part in objects["k"]]).tolist() == data.tolist()
    kinds, _ = cut_into_segments(100, [((10, 20), (40, 20))], 64)
    assert 0 in kinds  # a run inside the object, apart from others, travels whole
