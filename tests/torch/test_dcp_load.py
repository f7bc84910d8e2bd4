"""Loading a rank's pieces: in place when an item is a whole saved chunk, in waves of
bounded buffers otherwise, every node in one pass, neighbours in few requests, every
piece checked."""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultLoadPlanner
from torch.distributed.checkpoint.planner import ReadItem

from ckptstore.builtin import LocalPath
from ckptstore.errors import CorruptCheckpointError
from ckptstore.io import IOSettings, ParallelIO, crc32_of
from ckptstore.plugin import DBLocation
from ckptstore.plugin._coalesce import Span, coalesced_reads
from ckptstore.records import BlobRecord, ChunkRecord, NodeManifest
from ckptstore.torch._dcp_load import (
    MOST_IN_FLIGHT,
    REMOTE_RUN_BYTES,
    Want,
    bytes_of,
    engine_for,
    read_in_waves,
    run_bytes,
)
from ckptstore.torch.dcp import Reader, Writer, typed_errors


def test_a_whole_chunk_is_read_into_the_tensors_own_memory() -> None:
    tensor = torch.zeros(4, 3)
    data = bytes_of(tensor, torch.float32, 48)
    assert data is not None
    data[:4] = np.frombuffer(np.float32(2.5).tobytes(), np.uint8)
    assert tensor[0, 0] == 2.5


@pytest.mark.parametrize(
    ("tensor", "dtype", "nbytes"),
    [
        (torch.zeros(4, 3).t(), torch.float32, 48),  # not contiguous
        (torch.zeros(4, 3), torch.float64, 48),  # another dtype: a copy converts
        (torch.zeros(4, 3), torch.float32, 96),  # not the chunk's size
        (torch.zeros(0), torch.float32, 0),  # nothing to read into
    ],
)
def test_anything_else_is_read_into_a_buffer(
    tensor: torch.Tensor, dtype: torch.dtype, nbytes: int
) -> None:
    assert bytes_of(tensor, dtype, nbytes) is None


def _stored(storage: LocalPath, node: str, content: bytes) -> NodeManifest:
    """Node ``node`` of epoch 1: its archive holds ``content``, a 1 KiB blob per KiB."""
    storage.write_bytes(f"{node}.1/a.zip", content)
    blobs = {
        f"{node}{i}": BlobRecord(
            f"{node}{i}",
            "|u1",
            (1024,),
            (ChunkRecord("a.zip", i * 1024, 1024, 1024, crc32_of([content[i * 1024 :][:1024]])),),
        )
        for i in range(len(content) // 1024)
    }
    return NodeManifest(node, 1, "zarr", blobs)


def _want(manifest: NodeManifest, blob: str, in_place: bool = False) -> tuple[NodeManifest, Want]:
    record = manifest.blobs[blob]
    data = np.zeros(1024, np.uint8)
    return manifest, Want(None, f"tensor {blob!r}", record, 0, 0, data, None, in_place)  # type: ignore[arg-type]


def test_waves_hold_at_most_the_budget_of_buffers_and_read_every_node(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    a = _stored(storage, "a", bytes(range(256)) * 12)
    b = _stored(storage, "b", bytes(range(255, -1, -1)) * 12)
    wants = [_want(a, "a0"), _want(a, "a1"), _want(b, "b0", in_place=True), _want(b, "b1")]
    wants += [_want(a, "a2"), _want(b, "b2")]
    io = ParallelIO(IOSettings(chunk_bytes=4096, memory_budget=4096, concurrency=2))
    cut = [[want.record.name for _, want in wave] for wave in read_in_waves(storage, io, wants)]
    assert cut == [["a0", "a1", "b0", "b1", "a2"], ["b2"]]  # in place: no buffer held
    for manifest, want in wants:
        name = want.record.name
        expected = storage.read_bytes(f"{manifest.node}.1/a.zip", int(name[1]) * 1024, 1024)
        assert want.data.tobytes() == expected


def test_a_damaged_piece_of_one_of_several_nodes_names_its_node_and_tensor(
    tmp_path: Path,
) -> None:
    storage = LocalPath(str(tmp_path))
    a = _stored(storage, "a", bytes(2048))
    b = _stored(storage, "b", bytes(range(256)) * 8)
    raw = bytearray(storage.read_bytes("b.1/a.zip"))
    raw[1500] ^= 1
    storage.write_bytes("b.1/a.zip", bytes(raw))
    wants = [_want(a, "a0"), _want(a, "a1"), _want(b, "b0"), _want(b, "b1")]
    with pytest.raises(CorruptCheckpointError, match=r"tensor 'b1'") as raised:
        list(read_in_waves(storage, ParallelIO(), wants))
    assert (raised.value.node, raised.value.epoch, raised.value.blob) == ("b", 1, "b1")
    assert raised.value.file == "b.1/a.zip"


def test_neighbouring_pieces_are_read_in_runs_each_checked(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    content = bytes(range(256)) * 64  # 16 KiB: 16 pieces of 1 KiB
    storage.write_bytes("n.1/a.zip", content)
    db = DBLocation(storage, "n.1", ParallelIO())
    out = bytearray(len(content))
    view = memoryview(out)
    spans = [
        Span("a.zip", i, view[i : i + 1024], crc32_of([content[i : i + 1024]]), "b", i // 1024)
        for i in range(0, len(content), 1024)
    ]
    requests = list(coalesced_reads(db, spans, runs_of=8 << 10))
    assert len(requests) == 2
    db.read(requests)
    assert bytes(out) == content
    spans[3] = spans[3]._replace(crc=spans[3].crc ^ 1)
    with pytest.raises(CorruptCheckpointError) as raised:
        db.read(coalesced_reads(db, spans, runs_of=8 << 10))
    assert raised.value.chunk == 3


def test_reading_several_nodes_keeps_as_many_reads_in_flight_as_their_loads_would() -> None:
    disk = ParallelIO(IOSettings(concurrency=4))
    assert engine_for(disk, 1) is disk
    assert engine_for(disk, 2).settings.concurrency == 8
    assert engine_for(disk, 8).settings.concurrency == MOST_IN_FLIGHT
    store = ParallelIO(IOSettings(concurrency=64))
    assert engine_for(store, 4) is store  # already more than that


def test_object_stores_read_longer_runs() -> None:
    io = ParallelIO()
    assert run_bytes(LocalPath("x"), io) == io.settings.chunk_bytes < REMOTE_RUN_BYTES


def test_a_same_topology_load_fills_the_tensors_and_reads_each_piece_once(
    tmp_path: Path,
) -> None:
    state = {"w": torch.arange(100_000.0).reshape(1000, 100), "b": torch.ones(7), "step": 3}
    dcp.save(state, storage_writer=Writer(tmp_path, epoch=1, chunk_bytes=8192), no_dist=True)
    target = {"w": torch.zeros(1000, 100), "b": torch.zeros(7), "step": 0}
    address = target["w"].data_ptr()
    reader = Reader(tmp_path)
    dcp.load(target, storage_reader=reader, no_dist=True)
    assert torch.equal(target["w"], state["w"])
    assert torch.equal(target["b"], state["b"])
    assert target["step"] == 3
    assert target["w"].data_ptr() == address
    stored = 400_000 + 28
    assert stored <= reader.bytes_read < stored + 2048  # and the step's few bytes


def test_a_flipped_byte_of_a_piece_read_in_place_names_the_tensor(tmp_path: Path) -> None:
    state = {"w": torch.arange(50_000.0)}
    dcp.save(state, storage_writer=Writer(tmp_path, epoch=1, chunk_bytes=8192), no_dist=True)
    archive = next(tmp_path.rglob("blobs.zarr.zip"))
    raw = bytearray(archive.read_bytes())
    at = raw.find(np.float32(30_000.0).tobytes())
    raw[at] ^= 0x40
    archive.write_bytes(bytes(raw))
    with pytest.raises(CorruptCheckpointError, match=r"tensor 'w'") as raised, typed_errors():
        dcp.load({"w": torch.zeros(50_000)}, storage_reader=Reader(tmp_path), no_dist=True)
    assert raised.value.file is not None
    assert raised.value.file.endswith("blobs.zarr.zip")
    assert raised.value.chunk == 30_000 * 4 // 8192


class _Watching(DefaultLoadPlanner):
    """Notes whether the cyclic garbage collector runs while each tensor is looked up."""

    def __init__(self) -> None:
        super().__init__()
        self.collecting: list[bool] = []

    def resolve_tensor(self, read_item: ReadItem) -> torch.Tensor:
        self.collecting.append(gc.isenabled())
        return super().resolve_tensor(read_item)


def test_the_garbage_collector_waits_for_the_read_and_comes_back(tmp_path: Path) -> None:
    dcp.save(
        {"w": torch.ones(8), "b": torch.ones(3)},
        storage_writer=Writer(tmp_path, epoch=1),
        no_dist=True,
    )
    planner = _Watching()
    target = {"w": torch.zeros(8), "b": torch.zeros(3)}
    assert gc.isenabled()
    dcp.load(target, storage_reader=Reader(tmp_path), planner=planner, no_dist=True)
    assert planner.collecting == [False, False]
    assert gc.isenabled()
    assert torch.equal(target["w"], torch.ones(8))
