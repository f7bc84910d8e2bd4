"""`ckptstore demo`: the main job trains, checkpoints every epoch and resumes."""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from ckpt_helpers import flip_byte, node_dir

from ckptstore import protocol
from ckptstore.errors import JobConfigurationError, LeaseHeldError
from ckptstore.paths._local_path import LocalPath
from ckptstore.protocol import LeaseHolder, committed_nodes
from ckptstore.records._layout import lease_key
from ckptstore.tools._demo import DemoConfig, run_demo


def ckptstore(*args: str) -> str:
    result = subprocess.run(
        [shutil.which("ckptstore") or "ckptstore", *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return result.stdout


def test_console_script_trains_then_resumes_then_stops(tmp_path: Path) -> None:
    directory = str(tmp_path / "demo")
    first = ckptstore("demo", "--dir", directory, "--epochs", "2")
    assert "starting from scratch" in first
    assert "epoch   2/2" in first
    assert "checkpoint saved: 3 nodes" in first

    second = ckptstore("demo", "--dir", directory, "--epochs", "4")
    assert "resuming after epoch 2" in second
    assert "resumed from epoch 2" in second
    assert "epoch   1/" not in second
    assert "epoch   4/4" in second

    third = ckptstore("demo", "--dir", directory, "--epochs", "4")
    assert "already trained to epoch 4" in third

    fresh = ckptstore("demo", "--dir", directory, "--epochs", "1", "--fresh")
    assert "starting from scratch" in fresh
    assert "epoch   1/1" in fresh


@pytest.mark.parametrize("db_type", ["zarr", "npz"])
def test_resumed_training_reaches_the_same_weights(tmp_path: Path, db_type: str) -> None:
    out = io.StringIO()
    straight = run_demo(DemoConfig(str(tmp_path / "a"), epochs=4, db_type=db_type), out)
    run_demo(DemoConfig(str(tmp_path / "b"), epochs=2, db_type=db_type), out)
    resumed = run_demo(DemoConfig(str(tmp_path / "b"), epochs=4, db_type=db_type), out)
    assert straight is not None
    assert resumed is not None
    assert resumed.resumed_from == 2
    assert resumed.last_epoch == 4
    assert straight.weights.keys() == resumed.weights.keys()
    for name, weights in straight.weights.items():
        assert np.array_equal(weights, resumed.weights[name]), name
    assert straight.accuracy == resumed.accuracy > 0.5


def test_a_resume_past_a_damaged_epoch_says_where_it_did_resume(tmp_path: Path) -> None:
    directory = str(tmp_path / "demo")
    run_demo(DemoConfig(directory, epochs=2, nodes=2, db_type="npz"), io.StringIO())
    manifest = protocol.open_node(LocalPath(directory), "trainer_0", 2)
    chunk = manifest.blobs["trainer_0/weights"].chunks[0]
    flip_byte(node_dir(tmp_path / "demo", "trainer_0", 2) / chunk.key, chunk.offset)
    out = io.StringIO()
    result = run_demo(DemoConfig(directory, epochs=3, nodes=2, db_type="npz"), out)
    assert result is not None
    assert result.resumed_from == 1  # epoch 2 could not be restored
    assert "done: resumed from epoch 1, trained to epoch 3" in out.getvalue()


def test_demo_checkpoints_are_plain_zarr(tmp_path: Path) -> None:
    import zarr

    run_demo(DemoConfig(str(tmp_path), epochs=1), io.StringIO())
    store = zarr.storage.ZipStore(node_dir(tmp_path, "trainer_1", 1) / "blobs.zarr.zip", mode="r")
    group = zarr.open_group(store, mode="r")
    assert group["trainer_1/weights"].shape == (32,)
    assert int(group["trainer_1/epoch"][...]) == 1


def test_demo_refuses_a_job_it_cannot_run(tmp_path: Path) -> None:
    with pytest.raises(JobConfigurationError, match="--nodes >= 2"):
        run_demo(DemoConfig(str(tmp_path), nodes=1), io.StringIO())


def test_plugins_command_lists_the_built_ins() -> None:
    listing = ckptstore("plugins")
    for provided in ("db types: zarr", "db types: npz", "metadata handlers: json", "copy"):
        assert provided in listing
    assert "local (local paths, file, local)" in listing


def test_errors_exit_with_a_message(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "ckptstore.cli",
            "demo",
            "--dir",
            str(tmp_path),
            "--nodes",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2  # a usage error, like any out-of-range number
    assert "ckptstore: error: argument --nodes: 1 is too small" in result.stderr
    assert ">= 2" in result.stderr


def test_fresh_uncommits_then_starts_over_but_not_under_a_live_writer(tmp_path: Path) -> None:
    directory = str(tmp_path / "demo")
    out = io.StringIO()
    run_demo(DemoConfig(directory, epochs=2, nodes=2), out)
    storage = LocalPath(directory)
    other = LeaseHolder("trainer_0", "other-job", "elsewhere", 7, 1000.0, 4e9)
    storage.put_document(lease_key("trainer_0"), other.encode())
    with pytest.raises(LeaseHeldError, match="host elsewhere, pid 7"):
        run_demo(DemoConfig(directory, epochs=1, nodes=2, fresh=True), out)
    assert committed_nodes(storage, 2, ["trainer_0", "trainer_1"]) == {"trainer_0", "trainer_1"}
    storage.delete([lease_key("trainer_0")])
    fresh = run_demo(DemoConfig(directory, epochs=1, nodes=2, fresh=True), out)
    assert fresh is not None
    assert fresh.resumed_from is None
    assert committed_nodes(storage, 2, ["trainer_0", "trainer_1"]) == set()  # uncommitted, gone
