"""Real gloo jobs (``dcp_fork_jobs.py``) through ``ckptstore.torch.dcp``.

Resharding: a state of DTensors sharded along dim 0 and dim 1 (uneven shards) and
non-tensor entries, saved by N ranks, loads exactly on M; a few pairs by default, all
16 of N, M in 1..4 with ``CKPTSTORE_LONG_TESTS=1`` (the module ``test_dcp.py`` covers
1 -> 1, 1 -> 2, 2 -> 2, 2 -> 1 and 2 -> 4 with a DTensor model and Adam).

kill -9 of one rank of a 2-rank ``dcp.save`` / ``dcp.async_save`` through
``ckptstore.torch.dcp.Writer`` (``dcp_fork_jobs.py``): at every file-system write
boundary of either rank (every 6th one and the last by default; every one with
``CKPTSTORE_LONG_TESTS=1``), and on the moto S3 server before every request that can
change the bucket (one chosen by default), the epoch being saved is either not
accepted by ``Reader`` or loads exactly as saved, the previous epoch still loads
exactly, and ``ckptstore verify`` agrees.

Incremental DCP saves on 2 ranks write only the changed chunks, and their epochs load,
verify, copy, materialize and survive ``gc``."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from ckptstore.errors import CorruptCheckpointError
from ckptstore.protocol import CheckpointLocation, committed_nodes, open_node
from ckptstore.torch.dcp import Reader

DRIVER = Path(__file__).with_name("dcp_fork_jobs.py")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def full_target() -> dict[str, Any]:
    """The driver's zeroed structure of what its jobs save (``dcp_fork_jobs.full_target``)."""
    spec = importlib.util.spec_from_file_location("dcp_fork_jobs", DRIVER)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.full_target()  # type: ignore[no-any-return]


LONG = os.environ.get("CKPTSTORE_LONG_TESTS") == "1"
EVERY = 1 if LONG else 6
"""The kill points on local disk: every 6th file-system write of each rank and its last
by default, every one with ``CKPTSTORE_LONG_TESTS=1``."""
PAIRS = [(n, m) for n in range(1, 5) for m in range(1, 5)] if LONG else [(3, 2), (4, 3), (1, 4)]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}


def run_matrix(work: Path, pairs: list[tuple[int, int]], *extra: str) -> None:
    """Run the driver's N -> M jobs; every loading rank checks every value itself."""
    out = work / "out.json"
    text = ",".join(f"{n}:{m}" for n, m in pairs)
    result = subprocess.run(
        [sys.executable, str(DRIVER), str(work), "matrix", text, str(out), *extra],
        env={**ENV, **os.environ},
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert result.returncode == 0, result.stderr[-6000:]
    assert [tuple(pair) for pair in json.loads(out.read_text())["pairs"]] == pairs


@pytest.fixture(scope="module")
def matrix_roots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("matrix")
    run_matrix(work, PAIRS)
    return work


def test_a_state_saved_by_n_ranks_loads_exactly_on_m(matrix_roots: Path) -> None:
    for saving in {n for n, _ in PAIRS}:
        storage = CheckpointLocation.open(str(matrix_roots / f"saved-by-{saving}"), "zarr").storage
        assert committed_nodes(storage, 1) == {"dcp", *(f"rank_{r}" for r in range(saving))}


def test_saved_by_two_ranks_loads_on_three_on_the_gcs_emulator(
    tmp_path: Path, gcs_url: str, gcs_storage_options: dict[str, Any]
) -> None:
    run_matrix(tmp_path, [(2, 3)], gcs_url, json.dumps(gcs_storage_options))


def _stored_files(root: Path, epoch: int) -> list[str]:
    nodes = [p.name for p in root.iterdir() if p.name.endswith(f".{epoch}")]
    files = [
        str(f.relative_to(root)) for node in nodes for f in (root / node).rglob("*") if f.is_file()
    ]
    control = root / "_ckptstore" / f"epoch-{epoch}"
    return sorted([*files, *(f"_ckptstore/epoch-{epoch}/{f.name}" for f in control.iterdir())])


def _pieces(root: Path, relative: str) -> list[tuple[int, str]]:
    """(offset, blob) of one byte in each stored piece of each blob in ``relative``."""
    node, epoch = relative.split("/")[0].rsplit(".", 1)
    manifest = open_node(CheckpointLocation.open(str(root), "zarr").storage, node, int(epoch))
    name = relative.removeprefix(f"{manifest.data_key}/")
    return [
        (chunk.offset + chunk.size // 2, blob)
        for blob, record in manifest.blobs.items()
        for chunk in record.chunks
        if chunk.key == name
    ]


def _load_error(root: Path) -> BaseException:
    try:
        reader = Reader(root, epoch=1)
        dcp.load(full_target(), storage_reader=reader, no_dist=True)
    except CorruptCheckpointError as error:  # refused when the Reader was made
        return error
    except CheckpointException as wrapped:
        return wrapped.failures[0][0]
    raise AssertionError(f"{root}: the damaged epoch loaded")


def test_a_flipped_byte_in_any_stored_file_fails_the_load_naming_it(
    matrix_roots: Path,
) -> None:
    """In every file of a 3-rank save (commit records, manifests, the metadata, each
    stored piece of each rank's archive), one flipped byte makes the load of that
    epoch raise CorruptCheckpointError naming the file (and, for a piece, its tensor or
    entry). Bytes of an archive outside every piece (zip headers) are never read by a
    load: ``ckptstore verify --deep`` checks those."""
    root = matrix_roots / "saved-by-3"
    files = _stored_files(root, 1)
    assert len(files) == 12  # 3 ranks + dcp: a manifest, an archive, a commit record each
    flips = 0
    for relative in files:
        path = root / relative
        original = path.read_bytes()
        spots = (
            [(offset, blob) for offset, blob in _pieces(root, relative)]
            if relative.endswith(".zip")
            else [(len(original) // 2, None)]
        )
        assert spots, relative
        for offset, blob in spots:
            damaged = bytearray(original)
            damaged[offset] ^= 0x10
            path.write_bytes(bytes(damaged))
            try:
                error = _load_error(root)
            finally:
                path.write_bytes(original)
            assert isinstance(error, CorruptCheckpointError), (relative, error)
            assert error.file == relative, (relative, error.file)
            if blob is not None and not relative.startswith("dcp."):
                key = blob.split("#")[0]
                assert f"'{key}'" in str(error), (relative, blob, str(error))
            flips += 1
    assert flips > 20
    assert Reader(root, epoch=1).epoch == 1  # restored: intact again


def run_kills(work: Path, mode: str, points: str, *base: str) -> dict[str, Any]:
    """The driver's kill run (``dcp_fork_jobs.py``): what it counted and each trial."""
    out = work / "out.json"
    result = subprocess.run(
        [sys.executable, str(DRIVER), str(work), mode, points, str(out), *base],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert result.returncode == 0, result.stderr[-6000:]
    report: dict[str, Any] = json.loads(out.read_text())
    return report


def check_kills(report: dict[str, Any], expected: set[tuple[int, int]]) -> None:
    """Each kill point ``expected`` (rank, K) was a kill; after each, the driver found
    the newest epoch ``Reader`` accepts loading exactly, epoch 1 too, and ``ckptstore
    verify`` agreeing with ``Reader`` (``dcp_fork_jobs.verified``)."""
    trials = report["trials"]
    assert {(trial["rank"], trial["kill_at"]) for trial in trials} == expected
    assert all(trial["killed"] for trial in trials)
    # nothing damaged; "partial" (4) only where epoch 2's ranks were committed and its
    # metadata node not, so that Reader takes epoch 1
    assert {trial["verify"] for trial in trials} <= {0, 4}
    assert all(trial["newest"] == 1 for trial in trials if trial["verify"] == 4)
    # a rank that is not the coordinator dies before any commit record of epoch 2 exists
    assert {trial["newest"] for trial in trials if trial["rank"] == 1} <= {1}


def every(calls: list[int], step: int) -> set[tuple[int, int]]:
    """Every ``step``-th call of each rank and its last."""
    return {
        (rank, kill_at)
        for rank in (0, 1)
        for kill_at in {*range(1, calls[rank] + 1, step), calls[rank]}
    }


@pytest.mark.parametrize("mode", ["save", "async"])
def test_a_rank_killed_at_any_write_never_leaves_an_accepted_partial_epoch(
    tmp_path: Path, mode: str
) -> None:
    report = run_kills(tmp_path, mode, str(EVERY))
    calls, trials = report["calls"], report["trials"]
    assert calls[0] > calls[1] > 0  # the coordinator also writes the metadata and commits
    check_kills(report, every(calls, EVERY))
    first, last = trials[0], [t for t in trials if t["rank"] == 0][-1]
    assert (first["newest"], last["newest"]) == (1, 2)  # dead before anything / after commit


S3_POINTS = "1" if LONG else "0:-2"
"""Every S3 request of either rank that can change the bucket with
``CKPTSTORE_LONG_TESTS=1`` (11 of a 2-rank save: 9 of the coordinator, 2 of the other
rank); by default one: the coordinator's last but one (every rank's commit record
created, the metadata node's not yet: the state a kill most easily turns into an
accepted partial epoch)."""


@pytest.mark.parametrize("mode", ["save", "async"] if LONG else ["save"])
def test_a_rank_killed_at_any_s3_request_never_leaves_an_accepted_partial_epoch(
    tmp_path: Path, mode: str, s3_url: str, s3_storage_options: dict[str, Any]
) -> None:
    """As on local disk, on the moto S3 server: a rank dies by SIGKILL before its K-th
    request that can change the bucket (upload, part, delete; its other requests in
    flight are cut), each job saving epoch 1 and then epoch 2 under a root of its own."""
    options = json.dumps(s3_storage_options)
    report = run_kills(tmp_path, mode, S3_POINTS, s3_url, options)
    calls = report["calls"]
    assert calls[0] > calls[1] > 0
    if LONG:
        check_kills(report, every(calls, 1))
        trials = {(t["rank"], t["kill_at"]): t for t in report["trials"]}
        assert trials[(0, calls[0])]["newest"] == 2  # dead after the commit
    else:
        check_kills(report, {(0, calls[0] - 1)})
        before_metadata = report["trials"][0]
        assert (before_metadata["newest"], before_metadata["verify"]) == (1, 4)


CHUNK = 4 << 20
"""A chunk of the incremental chunk store (``ckptstore.protocol._chunks.CHUNK_BYTES``)."""


@pytest.mark.parametrize("where", ["disk", "s3"] if LONG else ["disk"])
def test_incremental_dcp_saves_write_only_changed_chunks_and_survive_gc(
    tmp_path: Path, where: str, request: pytest.FixtureRequest
) -> None:
    """Two gloo ranks save a 24 MiB sharded state three times with
    ``ckptstore.torch.save(..., incremental=True)`` (``dcp_fork_jobs.incremental``):
    the second save, of the same state, adds no chunk; the third, whose first 8 rows of
    one tensor changed, adds exactly the one 4 MiB chunk holding them. Every epoch loads
    exactly (on one process), ``verify`` passes, ``cp`` and ``cp --materialize`` make
    copies that load exactly (the materialized one with no chunk store), and after
    ``gc --keep-last 1`` the newest epoch still loads while the chunk only the deleted
    epochs used is freed. On local disk by default; on the moto S3 server too with
    ``CKPTSTORE_LONG_TESTS=1``."""
    out = tmp_path / "out.json"
    base: list[str] = []
    if where == "s3":
        options = request.getfixturevalue("s3_storage_options")
        base = [request.getfixturevalue("s3_url"), json.dumps(options)]
    result = subprocess.run(
        [sys.executable, str(DRIVER), str(tmp_path), "incremental", str(out), *base],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert result.returncode == 0, result.stderr[-6000:]
    report = json.loads(out.read_text())
    assert report["chunk_bytes"] == [6 * CHUNK, 6 * CHUNK, 7 * CHUNK]
    assert report["intents_left"] == []  # the coordinator released every rank's intent
    own = {epoch: stored - shared for epoch, (stored, shared) in report["ls"].items()}
    assert all(shared >= 6 * CHUNK for _, shared in report["ls"].values())
    assert max(own.values()) < 64 << 10  # the archives of the small entries and metadata
    assert report["verify"] == report["copy_verify"] == report["materialized_verify"] == 0
    assert (report["copy_chunks"], report["materialized_chunks"]) == (7, 0)
    assert report["gc"]["chunks"]["chunk_bytes_freed"] == CHUNK, report["gc"]
    assert report["chunk_bytes_after_gc"] == 6 * CHUNK
    assert report["verify_after_gc"] == 0
