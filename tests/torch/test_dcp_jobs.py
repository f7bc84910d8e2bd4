"""Real gloo jobs (``dcp_fork_jobs.py``) through ``ckptstore.torch.dcp``.

Resharding: a state of DTensors sharded along dim 0 and dim 1 (uneven shards) and
non-tensor entries, saved by N ranks, loads exactly on M; a few pairs by default, all
16 of N, M in 1..4 with ``CKPTSTORE_LONG_TESTS=1`` (the module ``test_dcp.py`` covers
1 -> 1, 1 -> 2, 2 -> 2, 2 -> 1 and 2 -> 4 with a DTensor model and Adam).

kill -9 of one rank of a 2-rank ``dcp.save`` / ``dcp.async_save`` through
``ckptstore.torch.dcp.Writer`` (``dcp_fork_jobs.py``): at every file-system write
boundary of either rank (every 30th one and the last by default; every one with
``CKPTSTORE_LONG_TESTS=1``), the epoch being saved is either not accepted by ``Reader``
or loads exactly as saved, and the previous epoch still loads exactly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

DRIVER = Path(__file__).with_name("dcp_fork_jobs.py")
LONG = os.environ.get("CKPTSTORE_LONG_TESTS") == "1"
EVERY = 1 if LONG else 30
PAIRS = [(n, m) for n in range(1, 5) for m in range(1, 5)] if LONG else [(3, 2), (4, 3), (1, 4)]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}


def test_a_state_saved_by_n_ranks_loads_exactly_on_m(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    pairs = ",".join(f"{n}:{m}" for n, m in PAIRS)
    result = subprocess.run(
        [sys.executable, str(DRIVER), str(tmp_path), "matrix", pairs, str(out)],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert result.returncode == 0, result.stderr[-6000:]  # each loading rank checked all
    assert [tuple(pair) for pair in json.loads(out.read_text())["pairs"]] == PAIRS


@pytest.mark.parametrize("mode", ["save", "async"])
def test_a_rank_killed_at_any_write_never_leaves_an_accepted_partial_epoch(
    tmp_path: Path, mode: str
) -> None:
    out = tmp_path / "out.json"
    result = subprocess.run(
        [sys.executable, str(DRIVER), str(tmp_path), mode, str(EVERY), str(out)],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert result.returncode == 0, result.stderr[-6000:]
    report = json.loads(out.read_text())
    calls, trials = report["calls"], report["trials"]
    assert calls[0] > calls[1] > 0  # the coordinator also writes the metadata and commits
    expected = {
        (rank, kill_at)
        for rank in (0, 1)
        for kill_at in {*range(1, calls[rank] + 1, EVERY), calls[rank]}
    }
    assert {(trial["rank"], trial["kill_at"]) for trial in trials} == expected
    assert all(trial["killed"] for trial in trials)
    # the driver checked each copy (newest loads exactly, epoch 1 too); a rank that is
    # not the coordinator dies before any commit record of epoch 2 exists
    assert {trial["newest"] for trial in trials if trial["rank"] == 1} == {1}
    first, last = trials[0], [t for t in trials if t["rank"] == 0][-1]
    assert (first["newest"], last["newest"]) == (1, 2)  # dead before anything / after commit
