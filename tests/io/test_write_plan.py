"""Planning the parallel write of packed archives: which archive takes which blob, how
small members group into one write each, how large arrays are cut for ``O_DIRECT``."""

from __future__ import annotations

import numpy as np

from ckptstore.io import DIRECT_ALIGN, GROUP_MEMBERS, _write_plan, aligned_pieces, write_groups


def test_shares_keep_small_blobs_first_and_balance_the_large_ones() -> None:
    big = _write_plan.ARCHIVE_BYTES
    sizes = {"s1": 10, "a": 3 * big, "s2": 20, "b": big, "c": big, "d": 2 * big}
    shares = _write_plan.archive_shares(sizes)
    assert len(shares) == _write_plan.MAX_ARCHIVES == 4  # 7 archives' worth: at most 4
    assert sorted(name for share in shares for name in share) == sorted(sizes)
    assert shares[0][:2] == ["s1", "s2"]  # every small blob in the first, in order
    loads = [sum(sizes[name] for name in share) for share in shares]
    assert max(loads) <= 3 * big + 30  # the largest blob alone sets the largest share
    assert _write_plan.archive_shares({"w": 2 * big - 1, "s": 5}) == [["w", "s"]]  # < 2: one
    assert _write_plan.archive_shares({}) == [[]]


def test_small_blobs_beyond_a_fair_share_spread_in_runs_of_consecutive_blobs() -> None:
    # one DCP rank's half of the 1 GiB mix on an object store: 8 shards of 48 MiB, 100
    # half-MiB shards and 1000 small ones, in 16 archives of 16 MiB or more
    sizes = {f"big{i}": 48 << 20 for i in range(8)}
    sizes |= {f"half{i}": (512 << 10) + i for i in range(100)}
    sizes |= {f"tiny{i}": 8 << 10 for i in range(1000)}
    shares = _write_plan.archive_shares(sizes, 16 << 20, 16)
    assert [name for share in shares for name in share if name not in sizes] == []
    assert sorted(name for share in shares for name in share) == sorted(sizes)
    loads = [sum(sizes[name] for name in share) for share in shares]
    assert max(loads) == 48 << 20  # was 108 MiB: every small blob in the first archive
    order = list(sizes)
    for share in shares:  # each share keeps the blobs' order...
        assert share == sorted(share, key=order.index)
        small = [order.index(name) for name in share if not name.startswith("big")]
        # ...and its small blobs come in runs of consecutive ones (SMALL_RUN_BYTES each)
        stretches = len([i for i in small if i == 0 or order[i - 1] not in share])
        nbytes = sum(sizes[order[i]] for i in small)
        assert stretches <= -(-nbytes // _write_plan.SMALL_RUN_BYTES)


def test_a_group_never_spans_a_pieced_member_nor_exceeds_its_limits() -> None:
    spans = [1] * (GROUP_MEMBERS + 10) + [100, 5, 5, 5]
    pieced = {GROUP_MEMBERS + 10}
    groups = list(write_groups(spans, pieced, most=12))
    assert [index for group in groups for index in group] == list(range(len(spans)))
    assert all(len(group) <= GROUP_MEMBERS for group in groups)
    assert [GROUP_MEMBERS + 10] in groups  # alone
    assert groups[-2:] == [[GROUP_MEMBERS + 11, GROUP_MEMBERS + 12], [GROUP_MEMBERS + 13]]


def test_inner_cuts_of_a_contiguous_array_fall_on_aligned_file_offsets() -> None:
    array = np.zeros(10 << 20, np.uint8)
    base = 12345
    pieces = aligned_pieces(array, 4 << 20, base)
    assert sum(piece.nbytes for piece in pieces) == array.nbytes
    assert all((base + piece.start) % DIRECT_ALIGN == 0 for piece in pieces[1:])
