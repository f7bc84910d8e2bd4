"""How a replica is cut into pieces: joined only where it must be, and a layout whose
segments leave their pieces refused."""

from __future__ import annotations

import numpy as np

from ckptstore.dask_session._replica_pieces import ReplicaLayout, carve

NODE = "trainer_0"
EPOCH = 2


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
