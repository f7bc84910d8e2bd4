"""ckptstore as DCP's storage, with real processes: gloo jobs of 1, 2 and 4 ranks on
127.0.0.1 (``dcp_ranks.py``) save a DTensor-sharded model with its Adam state and
non-tensor entries, and load it back on as many, fewer and more ranks; on local disk
and the moto S3 server. Corruption, write-once, a race of two saves, the CLI and
retention are checked on what the jobs saved.

The jobs are slow to start (torch's import): one job per world size does every case it
can, in the module-scoped fixtures."""

from __future__ import annotations

import gc
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict

import ckptstore.torch
from ckptstore.cli import main
from ckptstore.errors import (
    AlreadyCommittedError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    JobConfigurationError,
    LeaseHeldError,
    UnsupportedBlobError,
)
from ckptstore.protocol import (
    CheckpointLocation,
    WriterLease,
    committed_nodes,
    open_node,
    read_lease,
)
from ckptstore.testing.fixtures import TEST_CREDENTIALS
from ckptstore.torch.dcp import METADATA_NODE, Reader, Writer, typed_errors

WORKER = Path(__file__).with_name("dcp_ranks.py")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run_job(scenario: str, world: int, args: dict[str, Any], out: Path) -> list[dict[str, Any]]:
    """Run ``world`` ranks of ``scenario`` to the end; every rank must succeed."""
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    payload = json.dumps({**args, "out": str(out)})
    ranks = [
        subprocess.Popen(
            [sys.executable, str(WORKER), scenario, str(rank), str(world), str(port), payload],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(world)
    ]
    outputs = []
    for rank in ranks:
        try:
            output, _ = rank.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            for other in ranks:
                other.kill()
            raise
        outputs.append(output)
    failed = [number for number, rank in enumerate(ranks) if rank.returncode != 0]
    assert not failed, "\n".join(outputs[number][-4000:] for number in failed)
    return [json.loads(Path(f"{out}.{rank}.json").read_text()) for rank in range(world)]


@pytest.fixture(scope="module")
def s3_root(s3_server: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    bucket = f"t-dcp-{os.getpid()}"
    s3_server.create_bucket(bucket)
    options = {
        "endpoint_url": s3_server.endpoint_url,
        **TEST_CREDENTIALS,
        "client_kwargs": {"region_name": "us-east-1"},
    }
    yield f"s3://{bucket}/run", options
    if s3_server.running:
        s3_server.delete_bucket(bucket)


@pytest.fixture(scope="module")
def saved(
    tmp_path_factory: pytest.TempPathFactory, s3_root: tuple[str, dict[str, Any]]
) -> dict[str, Any]:
    """A 1-rank job saves a root; a 2-rank job saves epoch 5 (dcp.save) to local disk
    and S3 and epoch 6 (dcp.async_save), loads each back on 2 ranks (N -> N), and loads
    the 1-rank save (1 -> 2)."""
    base = tmp_path_factory.mktemp("dcp")
    one = {"roots": [[str(base / "one"), None]], "expected": str(base / "one.pt")}
    run_job("save", 1, one, base / "one-out")
    roots = [[str(base / "local"), None], list(s3_root)]
    two = {
        "roots": roots,
        "expected": str(base / "two.pt"),
        "one_rank_root": str(base / "one"),
        "one_rank_expected": str(base / "one.pt"),
    }
    run_job("save", 2, two, base / "two-out")
    return {
        "base": base,
        "root": base / "local",
        "expected": base / "two.pt",
        "s3": s3_root,
    }


def test_round_trips_on_as_many_ranks_and_one_to_two(saved: dict[str, Any]) -> None:
    """The jobs assert every value themselves; here, what they left: epochs 5 and 6,
    committed on the metadata node and both ranks."""
    storage = CheckpointLocation.open(str(saved["root"]), "zarr").storage
    for epoch in (5, 6):
        assert committed_nodes(storage, epoch) == {METADATA_NODE, "rank_0", "rank_1"}


def _full_target(expected: Any) -> Any:
    if isinstance(expected, torch.Tensor):
        return torch.zeros_like(expected)
    if isinstance(expected, dict):
        return {key: _full_target(value) for key, value in expected.items()}
    if isinstance(expected, list):
        return [_full_target(value) for value in expected]
    return None if isinstance(expected, str) else type(expected)()


def test_two_ranks_load_on_one_process(saved: dict[str, Any]) -> None:
    """2 -> 1: every DTensor's shards land in one full tensor, non-tensors too."""
    expected = torch.load(saved["expected"], weights_only=True)
    state = _full_target(expected)
    dcp.load(state, storage_reader=Reader(saved["root"], epoch=5), no_dist=True)
    _same(state, expected)


def test_two_ranks_saved_on_s3_load_on_one_process(saved: dict[str, Any]) -> None:
    """2 -> 1 from the moto S3 server, through ranged reads of each rank's archive."""
    expected = torch.load(saved["expected"], weights_only=True)
    state = _full_target(expected)
    root, options = saved["s3"]
    dcp.load(state, storage_reader=Reader(root, epoch=5, storage_options=options), no_dist=True)
    _same(state, expected)


def _same(actual: Any, expected: Any) -> None:
    if isinstance(expected, torch.Tensor):
        assert torch.equal(actual, expected)
        assert actual.dtype == expected.dtype
    elif isinstance(expected, dict):
        assert set(actual) == set(expected)
        for key, value in expected.items():
            _same(actual[key], value)
    elif isinstance(expected, list):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected, strict=True):
            _same(a, e)
    else:
        assert actual == expected
        assert type(actual) is type(expected)


def test_two_ranks_load_on_four_reading_only_what_they_need(saved: dict[str, Any]) -> None:
    """2 -> 4: each rank reads, through ranged reads, at most 1.1x the bytes it needs
    (counted under the reader, at its path type's reads)."""
    out = saved["base"] / "four-out"
    args = {"root": str(saved["root"]), "expected": str(saved["expected"])}
    results = run_job("load", 4, args, out)
    read = sum(result["read"] for result in results)
    needed = sum(result["needed"] for result in results)
    assert needed > 4 * (12 << 20)  # each rank needs 4 MiB of the weight and of each moment
    print(f"2 -> 4 ranks: read {read} bytes for {needed} needed ({read / needed:.3f}x)")
    assert read <= 1.1 * needed, (read, needed)
    assert all(result["reader_read"] <= result["read"] for result in results)


def _corrupted_copy(saved: dict[str, Any], name: str) -> Path:
    root = saved["base"] / name
    shutil.copytree(saved["root"], root)
    return root


def _flip(path: Path, offset: int) -> None:
    with path.open("r+b") as file:
        file.seek(offset)
        byte = file.read(1)
        file.seek(offset)
        file.write(bytes([byte[0] ^ 0x40]))


def test_a_flipped_data_byte_fails_the_load_naming_file_and_tensor(saved: dict[str, Any]) -> None:
    root = _corrupted_copy(saved, "flipped-data")
    storage = CheckpointLocation.open(str(root), "zarr").storage
    manifest = open_node(storage, "rank_1", 5)
    blob = "model.0.weight#2048,0"
    chunk = manifest.blobs[blob].chunks[5]
    _flip(root / manifest.data_key / chunk.key, chunk.offset + 17)
    expected = torch.load(saved["expected"], weights_only=True)
    with pytest.raises(CheckpointException) as raised:
        dcp.load(_full_target(expected), storage_reader=Reader(root, epoch=5), no_dist=True)
    error = raised.value.failures[0][0]
    assert isinstance(error, CorruptCheckpointError)
    assert (error.file, error.blob, error.chunk, error.node) == (
        f"{manifest.data_key}/{chunk.key}",
        blob,
        5,
        "rank_1",
    )
    assert "tensor 'model.0.weight'" in str(error)


def test_a_flipped_byte_in_a_manifest_record_or_metadata_is_corruption(
    saved: dict[str, Any],
) -> None:
    root = _corrupted_copy(saved, "flipped-control")
    files = open_node(CheckpointLocation.open(str(root), "zarr").storage, "rank_0", 6).data_key
    _flip(root / files / "ckptstore.manifest.json", 40)
    expected = torch.load(saved["expected"], weights_only=True)
    with pytest.raises(CheckpointException) as raised:
        dcp.load(_full_target(expected), storage_reader=Reader(root, epoch=6), no_dist=True)
    error = raised.value.failures[0][0]
    assert isinstance(error, CorruptCheckpointError)
    assert error.file == f"{files}/ckptstore.manifest.json"
    _flip(root / "_ckptstore" / "epoch-5" / "rank_1.commit.json", 30)
    with pytest.raises(CheckpointException) as raised:
        dcp.load(_full_target(expected), storage_reader=Reader(root, epoch=5), no_dist=True)
    error = raised.value.failures[0][0]
    assert isinstance(error, CorruptCheckpointError)
    assert error.file == "_ckptstore/epoch-5/rank_1.commit.json"
    storage = CheckpointLocation.open(str(root), "zarr").storage
    meta_manifest = open_node(storage, METADATA_NODE, 6)
    metadata = meta_manifest.blobs["metadata"].chunks[0]
    _flip(root / meta_manifest.data_key / metadata.key, metadata.offset + 30)
    with pytest.raises(CorruptCheckpointError, match="blob 'metadata'"):
        Reader(root, epoch=6)
    assert Reader(root).epoch == 5  # the newest intact metadata (its data is damaged)


def test_a_committed_epoch_is_write_once(saved: dict[str, Any]) -> None:
    with pytest.raises(AlreadyCommittedError):
        Writer(saved["root"], epoch=5)
    with pytest.raises(CheckpointNotFoundError):
        Reader(saved["root"], epoch=4)
    with pytest.raises(JobConfigurationError):
        dcp.save(
            {"w": torch.ones(1)},
            storage_writer=Writer(saved["root"], epoch=9),
            checkpoint_id="elsewhere",
            no_dist=True,
        )


def test_two_saves_of_one_epoch_race_and_one_wins(tmp_path: Path) -> None:
    """Both writers pass their constructor's check, then save at once: exactly one
    commits, and the epoch loads as that one's state, never a mix."""
    root = tmp_path / "race"
    states = [{"w": torch.full((64, 64), float(n)), "who": n} for n in range(2)]
    writers = [Writer(root, epoch=3) for _ in states]
    start = threading.Barrier(2)
    outcomes: list[BaseException | None] = [None, None]

    def save(number: int) -> None:
        start.wait()
        try:
            dcp.save(states[number], storage_writer=writers[number], no_dist=True)
        except BaseException as error:
            outcomes[number] = error

    threads = [threading.Thread(target=save, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    failed = [error for error in outcomes if error is not None]
    assert len(failed) == 1
    assert isinstance(failed[0], CheckpointException)
    cause = next(iter(failed[0].failures.values()))[0]
    assert isinstance(cause, LeaseHeldError | AlreadyCommittedError)
    winner = outcomes.index(None)
    loaded = {"w": torch.zeros(64, 64), "who": -1}
    dcp.load(loaded, storage_reader=Reader(root), no_dist=True)
    assert loaded["who"] == winner
    assert torch.equal(loaded["w"], states[winner]["w"])


def test_two_jobs_saving_one_epoch_one_wins(tmp_path: Path) -> None:
    """Two processes, each saving epoch 9 as a job of its own, released together by a
    barrier after both passed their Writer's check: one commits, the other is refused
    before committing, and the epoch holds the winner's bytes only."""
    results = run_job("race", 2, {"root": str(tmp_path / "race")}, tmp_path / "out")
    winners = [rank for rank, result in enumerate(results) if result["won"]]
    assert len(winners) == 1
    loser = results[1 - winners[0]]
    assert loser["cause"] in ("LeaseHeldError", "AlreadyCommittedError")
    loaded = {"w": torch.zeros(256, 256), "who": -1}
    dcp.load(loaded, storage_reader=Reader(tmp_path / "race"), no_dist=True)
    assert loaded["who"] == winners[0]
    assert torch.equal(loaded["w"], torch.full((256, 256), float(winners[0])))
    storage = CheckpointLocation.open(str(tmp_path / "race"), "zarr").storage
    assert committed_nodes(storage, 9) == {METADATA_NODE, "rank_0"}


def test_non_tensor_entries_are_checked_before_dcp_unpickles_them(tmp_path: Path) -> None:
    """DCP's planner unpickles byte entries with ``weights_only=False``; the reader
    first lets ``torch.load(weights_only=True)`` refuse what it would not load."""
    third = Fraction(1, 3)  # a class the weights-only unpickler does not allow
    dcp.save({"o": third, "n": 1}, storage_writer=Writer(tmp_path, epoch=1), no_dist=True)
    with pytest.raises(CheckpointException) as raised:
        dcp.load({"o": None, "n": 0}, storage_reader=Reader(tmp_path), no_dist=True)
    error = raised.value.failures[0][0]
    assert isinstance(error, UnsupportedBlobError)
    assert "allow_pickle" in str(error)
    trusted: dict[str, Any] = {"o": None, "n": 0}
    dcp.load(trusted, storage_reader=Reader(tmp_path, allow_pickle=True), no_dist=True)
    assert trusted == {"o": third, "n": 1}


def test_ls_verify_cp_and_gc_keep_last_see_dcp_epochs(saved: dict[str, Any]) -> None:
    root = _corrupted_copy(saved, "for-gc")  # an intact copy, to delete from
    assert main(["ls", str(root)]) == 0
    assert main(["verify", str(root)]) == 0
    copy = saved["base"] / "copied"
    assert main(["cp", str(root), str(copy), "--epoch", "5"]) == 0
    expected = torch.load(saved["expected"], weights_only=True)
    state = _full_target(expected)
    dcp.load(state, storage_reader=Reader(copy), no_dist=True)
    _same(state, expected)
    assert main(["gc", str(root), "--keep-last", "1"]) == 0
    storage = CheckpointLocation.open(str(root), "zarr").storage
    assert committed_nodes(storage, 5) == set()
    assert not (root / "rank_0.5").exists()
    assert Reader(root).epoch == 6


def test_a_round_trip_on_the_gcs_emulator(
    gcs_url: str, gcs_storage_options: dict[str, Any]
) -> None:
    state = {"w": torch.arange(300_000.0).reshape(1000, 300), "step": 3, "tag": "gcs"}
    writer = Writer(gcs_url, epoch=2, storage_options=gcs_storage_options)
    dcp.save(state, storage_writer=writer, no_dist=True)
    loaded = {"w": torch.zeros(1000, 300), "step": 0, "tag": ""}
    reader = Reader(gcs_url, storage_options=gcs_storage_options)
    dcp.load(loaded, storage_reader=reader, no_dist=True)
    assert reader.epoch == 2
    assert torch.equal(loaded["w"], state["w"])
    assert (loaded["step"], loaded["tag"]) == (3, "gcs")


def test_a_lease_held_by_another_job_fails_the_save_before_its_commit(tmp_path: Path) -> None:
    """The coordinator takes the writer lease while the ranks write: a live job holding
    it fails the save with ``LeaseHeldError`` once the coordinator's items are written,
    before anything is committed, and the coordinator's own attempt is deleted; once
    the other job lets go, the epoch saves."""
    location = CheckpointLocation.open(str(tmp_path), "zarr")
    other = WriterLease(location, [METADATA_NODE], heartbeat=False)
    other.acquire()
    try:
        with pytest.raises(LeaseHeldError), typed_errors():
            dcp.save({"w": torch.ones(64)}, storage_writer=Writer(tmp_path, epoch=4), no_dist=True)
        assert committed_nodes(location.storage, 4) == set()
        assert list((tmp_path / "rank_0.4").glob("attempt-*")) == []
    finally:
        other.release()
    dcp.save({"w": torch.ones(64)}, storage_writer=Writer(tmp_path, epoch=4), no_dist=True)
    assert Reader(tmp_path).epoch == 4


def test_a_committed_save_lets_go_of_the_lease_even_if_the_process_exits_at_once(
    tmp_path: Path,
) -> None:
    """The lease of a committed save is released in a thread of its own (dcp.save does
    not wait for it): the next save of the process waits for it, and a process that
    exits right after its save still releases it, so another job takes it at once."""
    dcp.save({"w": torch.ones(4)}, storage_writer=Writer(tmp_path, epoch=1), no_dist=True)
    dcp.save({"w": torch.ones(4)}, storage_writer=Writer(tmp_path, epoch=2), no_dist=True)
    code = (
        "import sys, torch, torch.distributed.checkpoint as dcp\n"
        "from ckptstore.torch.dcp import Writer\n"
        "dcp.save({'w': torch.ones(4)}, storage_writer=Writer(sys.argv[1], epoch=3), "
        "no_dist=True)\n"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, timeout=120)
    storage = CheckpointLocation.open(str(tmp_path), "zarr").storage
    assert read_lease(storage, METADATA_NODE) is None
    assert Reader(tmp_path).epoch == 3


def test_a_failed_save_lets_go_of_the_lease(tmp_path: Path) -> None:
    """A save failing after the coordinator took the lease (here: an entry DCP cannot
    pickle) releases it once its Writer is gone, so the next save need not wait for
    the lease to expire; nothing of the failed save is committed."""

    class Unpicklable:
        pass

    writer = Writer(tmp_path, epoch=1)
    with pytest.raises(CheckpointException):
        dcp.save({"o": Unpicklable()}, storage_writer=writer, no_dist=True)
    assert committed_nodes(CheckpointLocation.open(str(tmp_path), "zarr").storage, 1) == set()
    del writer
    gc.collect()
    dcp.save({"w": torch.ones(2)}, storage_writer=Writer(tmp_path, epoch=1), no_dist=True)
    assert Reader(tmp_path).epoch == 1


def test_keys_longer_than_a_blob_name_are_stored_under_a_hashed_name(tmp_path: Path) -> None:
    long_key = "module." * 60 + "weight"
    state = {long_key: torch.arange(4.0), "a" * 300: "long"}
    dcp.save(state, storage_writer=Writer(tmp_path, epoch=1), no_dist=True)
    loaded: dict[str, Any] = {long_key: torch.zeros(4), "a" * 300: ""}
    dcp.load(loaded, storage_reader=Reader(tmp_path), no_dist=True)
    assert torch.equal(loaded[long_key], state[long_key])
    assert loaded["a" * 300] == "long"


def test_save_and_restore_of_an_fsdp2_model_go_through_dcp(tmp_path: Path) -> None:
    """``ckptstore.torch.save/restore`` on 2 ranks of an FSDP2 (``fully_shard``) model
    with Adam and an LR scheduler: each rank saves its shards, a committed epoch is
    refused with ``AlreadyCommittedError`` on every rank, and a restore takes the newest
    epoch (the job checks the gathered tensors); then one process without
    ``torch.distributed`` restores the plain model from the shards (2 -> 1)."""
    root = tmp_path / "fsdp"
    results = run_job("two_lines", 2, {"root": str(root)}, tmp_path / "out")
    assert results == [{"epoch": 2, "refused": "AlreadyCommittedError"}] * 2
    storage = CheckpointLocation.open(str(root), "zarr").storage
    assert committed_nodes(storage, 2) == {METADATA_NODE, "rank_0", "rank_1"}
    model_state, optim_state = torch.load(f"{root}.expected.pt", weights_only=True)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.Linear(96, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    assert ckptstore.torch.restore(str(root), model=model, optimizer=optimizer) == 2
    _same(model.state_dict(), model_state)
    _same(get_state_dict(model, optimizer)[1]["state"], optim_state["state"])


def test_the_two_line_api_raises_ckptstore_errors_not_dcps(tmp_path: Path) -> None:
    """A refusal inside DCP (here a damaged byte found while reading) comes out of
    ``ckptstore.torch.restore`` as the ckptstore error itself."""
    model = torch.nn.Linear(300, 200)
    state = {"model": model.state_dict()}
    dcp.save(state, storage_writer=Writer(tmp_path, epoch=1), no_dist=True)
    storage = CheckpointLocation.open(str(tmp_path), "zarr").storage
    manifest = open_node(storage, "rank_0", 1)
    chunk = manifest.blobs["model.weight#0,0"].chunks[0]
    _flip(tmp_path / manifest.data_key / chunk.key, chunk.offset + 5)
    with pytest.raises(CorruptCheckpointError, match=r"tensor 'model\.weight'"):
        ckptstore.torch.restore(str(tmp_path), model=torch.nn.Linear(300, 200))
