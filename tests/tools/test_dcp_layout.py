"""``ckptstore inspect`` on a DCP epoch: each tensor's global shape and saved chunks;
``convert`` and ``cp --materialize`` of one (its metadata rebound to the new manifests)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ckptstore.cli import main
from ckptstore.protocol import CheckpointLocation, require_commit
from ckptstore.tools._dcp_layout import METADATA_KIND, describe_dcp, rebind_nodes
from ckptstore.tree import save_tree

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def test_inspect_shows_global_shapes_and_chunks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch.distributed.checkpoint as dcp

    from ckptstore.torch.dcp import Writer

    state = {"w": torch.ones(6, 4), "step": 3}
    dcp.save(state, storage_writer=Writer(tmp_path, epoch=2), no_dist=True)
    storage = CheckpointLocation.open(str(tmp_path), "zarr").storage
    assert describe_dcp(storage, 2) == [
        {
            "key": "w",
            "dtype": "float32",
            "shape": [6, 4],
            "chunks": [{"offsets": [0, 0], "sizes": [6, 4], "node": "rank_0"}],
        }
    ]
    assert main(["inspect", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "DCP tensors (1)" in out
    assert "at (0, 0)           size (6, 4)           in rank_0" in out
    assert main(["inspect", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["dcp"][0]["shape"] == [6, 4]


def test_an_epoch_without_dcp_metadata_has_no_dcp_section(tmp_path: Path) -> None:
    save_tree(str(tmp_path), 1, {"a": np.ones(3)})
    assert describe_dcp(CheckpointLocation.open(str(tmp_path), "zarr").storage, 1) is None


def test_a_dcp_epoch_rewritten_by_convert_or_materialize_still_loads(tmp_path: Path) -> None:
    """``convert`` (in place) and ``cp --materialize`` write a DCP epoch's rank nodes
    again, so their manifests change: the metadata node, rewritten last, names the new
    ones (``rebind_nodes``), and ``Reader`` loads the rewritten epoch exactly."""
    import torch.distributed.checkpoint as dcp

    from ckptstore.torch.dcp import Reader, Writer

    state = {"w": torch.arange(3 << 18, dtype=torch.float32), "b": torch.ones(3), "step": 3}
    root, copy = tmp_path / "root", tmp_path / "materialized"
    writer = Writer(root, epoch=1, incremental=True)
    dcp.save(state, storage_writer=writer, no_dist=True)
    assert main(["cp", str(root), str(copy), "--materialize"]) == 0
    assert main(["convert", str(root), "--to", "npz"]) == 0
    for where in (root, copy):
        loaded = {"w": torch.zeros(3 << 18), "b": torch.zeros(3), "step": 0}
        dcp.load(loaded, storage_reader=Reader(where), no_dist=True)
        assert torch.equal(loaded["w"], state["w"]), where
        assert (torch.equal(loaded["b"], state["b"]), loaded["step"]) == (True, 3)
    assert not (copy / "_ckptstore" / "chunks").exists()  # self-contained
    storage = CheckpointLocation.open(str(root), "zarr").storage
    assert {node: c.db_type for node, c in require_commit(storage, 1).nodes.items()} == {
        "dcp": "npz",
        "rank_0": "npz",
    }


def test_rebinding_refuses_a_document_naming_an_unknown_node(tmp_path: Path) -> None:
    from ckptstore.errors import CorruptCheckpointError
    from ckptstore.records import encode_document

    document = encode_document(METADATA_KIND, {"nodes": {"rank_0": 1, "rank_9": 2}})
    assert b'"rank_0":7' in rebind_nodes(document, {"rank_0": 7, "rank_9": 8}, url="u")
    with pytest.raises(CorruptCheckpointError, match="rank nodes the epoch does not hold"):
        rebind_nodes(document, {"rank_0": 7}, url="u")
