"""`ckptstore cp`: any path type to any other, parallel, verified, resumable."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

from ckpt_helpers import data_key
from cli_helpers import Cli

from ckptstore import protocol
from ckptstore.formats._npz_db import NpzDB
from ckptstore.io._engine import ParallelIO
from ckptstore.paths._local_path import LocalPath
from ckptstore.plugin._registry import get_registry
from ckptstore.testing.conformance import NODES, assert_same_blob, expected_state, flip_byte


def load(url: str, node: str, epoch: int) -> dict[str, Any]:
    storage = get_registry().open_path(url)
    manifest = protocol.open_node(storage, node, epoch)
    return protocol.read_blobs(storage, manifest, None, NpzDB(), ParallelIO())


def test_copies_every_committed_epoch_and_commits_it(
    cli: Cli, run_url: str, tmp_path: Path
) -> None:
    dest = str(tmp_path / "copy")
    result = cli("cp", run_url, dest, "--jobs", "2", "--json")
    assert result.code == 0
    report = result.json()
    assert report["epochs"] == [0, 1, 2, 3]
    assert len(report["copied"]) == 8
    assert report["skipped"] == []
    for node in NODES:
        loaded = load(dest, node, 3)
        for name, blob in expected_state(node, 3).items():
            assert_same_blob(loaded[name], blob)
    assert cli("verify", dest).code == 0


def test_a_second_copy_skips_what_is_there(cli: Cli, run_url: str, tmp_path: Path) -> None:
    dest = str(tmp_path / "copy")
    assert cli("cp", run_url, dest, "--epoch", "1").code == 0
    result = cli("cp", run_url, dest, "--json")
    assert [d["epoch"] for d in result.json()["skipped"]] == [1, 1]
    assert len(result.json()["copied"]) == 6
    forced = cli("cp", run_url, dest, "--latest", "--force", "--json").json()
    assert len(forced["copied"]) == 2


def test_copies_between_path_types(cli: Cli, run_url: str) -> None:
    memory = f"memory://cp-{uuid.uuid4().hex}"
    assert cli("cp", run_url, memory, "--latest").code == 0
    back = run_url + "-back"
    assert cli("cp", memory, back).code == 0
    assert protocol.committed_nodes(LocalPath(back), 3) == set(NODES)
    assert cli("verify", memory).code == 0


def test_a_corrupt_source_is_not_copied(cli: Cli, run_url: str, tmp_path: Path) -> None:
    storage = LocalPath(run_url)
    chunk = protocol.open_node(storage, "trainer_0", 3).blobs["trainer_0/w"].chunks[0]
    flip_byte(storage, f"{data_key(storage, 'trainer_0', 3)}/{chunk.key}", chunk.offset)
    dest = tmp_path / "copy"
    result = cli("cp", run_url, str(dest), "--latest")
    assert result.code == 3
    assert "trainer_0" in result.err
    assert protocol.committed_nodes(LocalPath(str(dest)), 3) == set()


def test_progress_bar_counts_bytes(cli: Cli, run_url: str, tmp_path: Path) -> None:
    result = cli("cp", run_url, str(tmp_path / "copy"), "--progress")
    assert result.code == 0
    assert "copy and verify: 100%" in result.err  # each byte copied, then read back
    # the bar ends with done == total: the bytes of the 8 node checkpoints, twice
    assert re.search(r"100%\|.*\| (\S+)/\1 ", result.err), result.err
    assert "copied 8 node checkpoint(s)" in result.out
    unverified = cli("cp", run_url, str(tmp_path / "other"), "--progress", "--no-verify")
    assert "copy: 100%" in unverified.err


def test_nothing_to_copy_exits_4(cli: Cli, tmp_path: Path) -> None:
    assert cli("cp", str(tmp_path / "empty"), str(tmp_path / "copy")).code == 4


def test_an_incremental_epoch_copies_only_the_shared_chunks_the_destination_lacks(
    cli: Cli, tmp_path: Path
) -> None:
    import numpy as np

    from ckptstore.tree import load_tree, save_tree

    source, dest = str(tmp_path / "src"), str(tmp_path / "dst")
    base = np.ones(1 << 18)  # 2 MiB, in both epochs: one chunk
    for epoch in (0, 1):
        save_tree(source, epoch, {"base": base, "new": np.full(1 << 17, epoch)}, incremental=True)
    assert cli("cp", source, dest, "--epoch", "0").code == 0
    chunks = Path(dest) / "_ckptstore" / "chunks"
    before = {path.name: path.stat().st_ino for path in chunks.iterdir()}
    assert len(before) == 2
    assert cli("cp", source, dest).code == 0
    after = {path.name: path.stat().st_ino for path in chunks.iterdir()}
    assert len(after) == 3  # epoch 1's own chunk; the base chunk is neither copied nor replaced
    assert all(after[name] == inode for name, inode in before.items())
    assert cli("verify", dest).code == 0
    tree = load_tree(dest, 1)
    assert isinstance(tree, dict)
    assert tree["new"].tolist() == [1] * (1 << 17)
    assert LocalPath(dest).list_keys("_ckptstore/intents") == []


def test_cp_materialize_writes_self_contained_epochs_that_plain_zarr_reads(
    cli: Cli, tmp_path: Path
) -> None:
    import numpy as np
    import zarr

    from ckptstore.tree import save_tree

    source, dest = str(tmp_path / "src"), str(tmp_path / "dst")
    base = np.arange(1 << 18, dtype=np.float64)  # 2 MiB: a shared chunk at the source
    save_tree(source, 0, {"base": base}, incremental=True)
    result = cli("cp", source, dest, "--materialize")
    assert result.code == 0, result.err
    assert "wrote 1 self-contained node checkpoint(s)" in result.out
    assert not (Path(dest) / "_ckptstore" / "chunks").exists()
    assert cli("verify", dest).code == 0
    node = data_key(LocalPath(dest), "tree", 0)
    store = zarr.storage.ZipStore(f"{dest}/{node}/blobs.zarr.zip", mode="r")
    group = zarr.open_group(store, mode="r")
    names = [name for name, _ in group.arrays()]
    assert any(np.array_equal(group[name][...], base) for name in names)


def test_another_checkpoint_of_the_epoch_at_dst_is_replaced_only_with_force(
    cli: Cli, run_url: str, tmp_path: Path
) -> None:
    """DST holds epoch 3 with other manifests (converted to zarr there): cp refuses,
    names ``--force`` and leaves DST's epoch as it was; ``--force`` replaces it."""
    dest = str(tmp_path / "copy")
    assert cli("cp", run_url, dest, "--latest").code == 0
    assert cli("convert", dest, "--to", "zarr", "--latest").code == 0
    theirs = protocol.read_commit(LocalPath(dest), 3)
    assert theirs is not None
    refused = cli("cp", run_url, dest, "--latest")
    assert refused.code == 1
    assert "--force" in refused.err
    assert "Traceback" not in refused.err
    assert protocol.read_commit(LocalPath(dest), 3) == theirs
    assert cli("cp", run_url, dest, "--latest", "--force").code == 0
    ours = protocol.read_commit(LocalPath(run_url), 3)
    replaced = protocol.read_commit(LocalPath(dest), 3)
    assert ours is not None
    assert replaced is not None
    assert {n: c.manifest_crc32c for n, c in replaced.nodes.items()} == {
        n: c.manifest_crc32c for n, c in ours.nodes.items()
    }
