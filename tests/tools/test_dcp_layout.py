"""``ckptstore inspect`` on a DCP epoch: each tensor's global shape and saved chunks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ckptstore.cli import main
from ckptstore.protocol import CheckpointLocation
from ckptstore.tools._dcp_layout import describe_dcp
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
