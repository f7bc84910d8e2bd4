"""Checkpoints written before attempt directories still load, verify, copy, convert
and list. ``legacy_layout/`` was written by ckptstore at 054a46d (the commit before
attempts): trainer_0 (zarr) and trainer_1 (npz), epochs 1 and 2, files directly in
``<node>.<epoch>/``; epoch 1 has the one-document commit record of the oldest versions,
epoch 2 per-node records without an attempt."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from ckpt_helpers import files_under

from ckptstore.builtin import LocalPath
from ckptstore.cli._main import main
from ckptstore.io import ParallelIO
from ckptstore.plugin._registry import get_registry
from ckptstore.protocol import (
    check_not_committed,
    commit_epoch,
    open_node,
    read_blobs,
    read_commit,
    write_node,
)
from ckptstore.protocol._garbage import collect_garbage, find_garbage

FIXTURE = Path(__file__).with_name("legacy_layout")
FORMATS = {"trainer_0": "zarr", "trainer_1": "npz"}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    copy = tmp_path / "legacy"
    shutil.copytree(FIXTURE, copy)
    return copy


def expected(node: str, epoch: int) -> dict[str, list[object]]:
    return {f"{node}/w": (np.arange(6.0).reshape(2, 3) * epoch).tolist(), f"{node}/step": epoch}


def loaded(storage: LocalPath, node: str, epoch: int) -> dict[str, object]:
    manifest = open_node(storage, node, epoch)
    reader = get_registry().db_type(manifest.db_type)
    return {
        name: value.tolist()
        for name, value in read_blobs(storage, manifest, None, reader, ParallelIO()).items()
    }


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(list(args))
    return code, capsys.readouterr().out


def test_the_fixture_is_the_old_layout() -> None:
    files = files_under(FIXTURE)
    assert "trainer_0.1/blobs.zarr.zip" in files
    assert "_ckptstore/epoch-1.commit.json" in files
    record = json.loads((FIXTURE / "_ckptstore/epoch-2/trainer_0.commit.json").read_bytes())
    assert "attempt" not in record
    assert not any("attempt-" in name for name in files)


def test_every_node_and_epoch_loads(root: Path) -> None:
    storage = LocalPath(str(root))
    for epoch in (1, 2):
        record = read_commit(storage, epoch)
        assert record is not None
        assert sorted(record.nodes) == sorted(FORMATS)
        for node in FORMATS:
            assert record.nodes[node].attempt is None
            assert record.nodes[node].data_key == f"{node}.{epoch}"
            assert loaded(storage, node, epoch) == expected(node, epoch)


def test_ls_verify_inspect_cp_and_convert_work_on_it(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = cli(capsys, "ls", str(root), "--json")
    assert code == 0
    (run,) = json.loads(out)["runs"]
    assert [(epoch["epoch"], epoch["state"]) for epoch in run["epochs"]] == [
        (1, "committed"),
        (2, "committed"),
    ]
    assert [node["data_key"] for node in run["epochs"][0]["nodes"]] == [
        "trainer_0.1",
        "trainer_1.1",
    ]
    assert cli(capsys, "verify", str(root), "--deep")[0] == 0
    code, out = cli(capsys, "inspect", str(root), "--epoch", "2", "--json")
    assert code == 0
    assert [node["data_key"] for node in json.loads(out)["nodes"]] == ["trainer_0.2", "trainer_1.2"]
    copy = tmp_path / "copy"
    assert cli(capsys, "cp", str(root), str(copy))[0] == 0
    for epoch in (1, 2):
        for node in FORMATS:
            assert loaded(LocalPath(str(copy)), node, epoch) == expected(node, epoch)
            assert read_commit(LocalPath(str(copy)), epoch, [node]).nodes[node].attempt
    converted = tmp_path / "converted"
    code, _ = cli(capsys, "convert", str(root), "--to", "npz", "--dest", str(converted))
    assert code == 0
    assert loaded(LocalPath(str(converted)), "trainer_0", 2) == expected("trainer_0", 2)
    assert open_node(LocalPath(str(converted)), "trainer_0", 2).db_type == "npz"


def test_saving_over_it_writes_an_attempt_and_gc_deletes_the_old_files(root: Path) -> None:
    storage = LocalPath(str(root))
    check_not_committed(storage, 2, ["trainer_0"], overwrite=True)
    assert find_garbage(storage) == []  # uncommitted now: nothing is garbage
    blobs = {"trainer_0/w": np.ones(2)}
    written = write_node(
        storage, "trainer_0", 2, blobs, get_registry().db_type("zarr"), ParallelIO()
    )
    commit_epoch(storage, 2, [written])
    assert loaded(storage, "trainer_0", 2) == {"trainer_0/w": [1.0, 1.0]}
    (garbage,) = find_garbage(storage)
    assert garbage.key == "trainer_0.2"
    assert sorted(garbage.files) == [
        "trainer_0.2/blobs.zarr.zip",
        "trainer_0.2/ckptstore.manifest.json",
    ]
    collect_garbage(storage, [garbage])
    assert files_under(root / "trainer_0.2") == [
        f"{written.data_key.split('/')[1]}/{name}" for name in files_under(root / written.data_key)
    ]
    assert loaded(storage, "trainer_0", 2) == {"trainer_0/w": [1.0, 1.0]}
    assert loaded(storage, "trainer_1", 2) == expected("trainer_1", 2)  # untouched
