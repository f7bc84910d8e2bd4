"""DCP's Metadata as a JSON control document: faithful for what DCP's default planners
produce, and every stored field checked as untrusted input."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from torch.distributed.checkpoint import metadata as dcp_metadata

from ckptstore.errors import CorruptCheckpointError, UnsupportedBlobError
from ckptstore.protocol import NodeCommit
from ckptstore.records import decode_document, encode_document
from ckptstore.torch._dcp_metadata import (
    METADATA_KIND,
    StoredItem,
    decode_metadata,
    encode_metadata,
)


def _metadata(planner_data: object = None) -> tuple[dcp_metadata.Metadata, list[Any]]:
    chunks = [
        dcp_metadata.ChunkStorageMetadata(torch.Size([0, 0]), torch.Size([2, 3])),
        dcp_metadata.ChunkStorageMetadata(torch.Size([2, 0]), torch.Size([1, 3])),
    ]
    tensor = dcp_metadata.TensorStorageMetadata(
        dcp_metadata.TensorProperties(dtype=torch.bfloat16, requires_grad=True),
        torch.Size([3, 3]),
        chunks,
    )
    metadata = dcp_metadata.Metadata(
        {"model.w": tensor, "step": dcp_metadata.BytesStorageMetadata()},
        planner_data=planner_data,
        version="1.0.0",
    )
    commits = [NodeCommit(f"rank_{r}", 4, "zarr", 1000 + r, 10, 20, 2) for r in range(2)]
    stored = [
        (
            dcp_metadata.MetadataIndex("model.w", torch.Size([0, 0])),
            StoredItem("rank_0", "model.w#0,0", commits[0]),
        ),
        (
            dcp_metadata.MetadataIndex("model.w", torch.Size([2, 0])),
            StoredItem("rank_1", "model.w#2,0", commits[1]),
        ),
        (dcp_metadata.MetadataIndex("step"), StoredItem("rank_0", "step", commits[0])),
    ]
    return metadata, stored


def test_the_metadata_round_trips() -> None:
    metadata, stored = _metadata({"model.w": ("model", "w"), "step": ("step",)})
    decoded = decode_metadata(encode_metadata(metadata, stored), url="/r", key="k")
    assert decoded.metadata.state_dict_metadata == metadata.state_dict_metadata
    assert decoded.metadata.planner_data == {"model.w": ("model", "w"), "step": ("step",)}
    assert decoded.metadata.version == "1.0.0"
    assert decoded.items[("model.w", (2, 0))] == ("rank_1", "model.w#2,0")
    assert decoded.items[("step", None)] == ("rank_0", "step")
    assert decoded.nodes == {"rank_0": 1000, "rank_1": 1001}


def test_planner_data_that_is_not_plain_data_is_refused() -> None:
    metadata, stored = _metadata({"model.w": (object(),)})
    with pytest.raises(UnsupportedBlobError, match="planner_data"):
        encode_metadata(metadata, stored)


def _forged(change: Any) -> bytes:
    metadata, stored = _metadata()
    body = decode_document(encode_metadata(metadata, stored), METADATA_KIND, url="/r", key="k")
    body = {key: value for key, value in body.items() if key not in ("kind", "version")}
    change(body)
    return encode_document(METADATA_KIND, body)  # a forger can recompute the CRC


FORGERIES = {
    "unknown dtype": lambda b: b["tensors"]["model.w"].update(dtype="object"),
    "chunk outside": lambda b: b["tensors"]["model.w"]["chunks"][1][0].__setitem__(0, 3),
    "huge size": lambda b: b["tensors"]["model.w"].update(size=[1 << 40, 1 << 40]),
    "negative offset": lambda b: b["items"][0][1].__setitem__(0, -1),
    "missing item": lambda b: b["items"].pop(),
    "unknown node": lambda b: b["items"][0].__setitem__(2, "rank_9"),
    "traversing blob": lambda b: b["items"][0].__setitem__(3, "../x"),
    "bad node name": lambda b: b["nodes"].update({"../n": 1}),
    "checksum too large": lambda b: b["nodes"].update(rank_0=1 << 40),
    "planner path object": lambda b: b.update(planner_data={"step": [{"a": 1}]}),
    "tensors a list": lambda b: b.update(tensors=[]),
    "too many dims": lambda b: b["tensors"]["model.w"].update(size=[1] * 65),
}


@pytest.mark.parametrize("change", FORGERIES.values(), ids=FORGERIES.keys())
def test_a_forged_document_is_corruption(change: Any) -> None:
    with pytest.raises(CorruptCheckpointError, match="DCP metadata document is malformed"):
        decode_metadata(_forged(change), url="/r", key="k")


def test_a_flipped_byte_or_another_kind_is_corruption() -> None:
    metadata, stored = _metadata()
    data = bytearray(encode_metadata(metadata, stored))
    data[len(data) // 2] ^= 0x01
    with pytest.raises(CorruptCheckpointError):
        decode_metadata(bytes(data), url="/r", key="k")
    with pytest.raises(CorruptCheckpointError, match="expected"):
        decode_metadata(encode_document("other", {"x": 1}), url="/r", key="k")
    assert json.loads(encode_metadata(metadata, stored))["kind"] == METADATA_KIND
