"""`ckptstore gc`: retention from the command line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from cli_helpers import Cli, train

from ckptstore.builtin._json_catalog import JsonCatalog
from ckptstore.formats._npz_db import NpzDB
from ckptstore.io._engine import ParallelIO
from ckptstore.paths._local_path import LocalPath
from ckptstore.protocol import committed_nodes, write_node
from ckptstore.protocol._inventory import committed_epochs


def test_dry_run_deletes_nothing(cli: Cli, run_url: str) -> None:
    result = cli("gc", run_url, "--keep-last", "2", "--dry-run", "--json")
    assert result.code == 0
    plan = result.json()
    assert plan["dry_run"] is True
    assert [removal["epoch"] for removal in plan["delete"]] == [0, 1]
    assert plan["keep"] == [2, 3]
    assert plan["freed_bytes"] > 0
    assert committed_epochs(LocalPath(run_url)) == [0, 1, 2, 3]


def test_keeps_the_last_n_and_every_kth(cli: Cli, tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    train(url, epochs=7)
    result = cli("gc", url, "--keep-last", "2", "--keep-every", "3")
    assert result.code == 0
    assert "deleted 4 epoch(s)" in result.out
    assert committed_epochs(LocalPath(url)) == [0, 3, 6, 7]
    kept = sorted(f"trainer_{n}.{e}" for e in (0, 3, 6, 7) for n in (0, 1))
    assert sorted(path.name for path in Path(url).iterdir()) == ["_ckptstore", *kept]
    assert cli("verify", url).code == 0


def test_keep_last_must_be_positive(cli: Cli, run_url: str) -> None:
    result = cli("gc", run_url, "--keep-last", "0")
    assert result.code == 2  # a bad command line, refused before anything is opened
    assert "argument --keep-last: 0 is too small: expected a whole number >= 1" in result.err
    assert committed_epochs(LocalPath(run_url)) == [0, 1, 2, 3]


def test_gc_of_one_node_leaves_the_other_nodes_committed(cli: Cli, run_url: str) -> None:
    dry = cli("gc", run_url, "--keep-last", "1", "--node", "trainer_0", "--dry-run", "--json")
    assert dry.code == 0
    assert [(r["epoch"], r["nodes"]) for r in dry.json()["delete"]] == [
        (epoch, ["trainer_0"]) for epoch in (0, 1, 2)
    ]
    assert sorted(p.name for p in Path(run_url).glob("trainer_0.*")) == [
        f"trainer_0.{epoch}" for epoch in range(4)
    ]  # the dry run deleted nothing
    result = cli("gc", run_url, "--keep-last", "1", "--node", "trainer_0")
    assert result.code == 0
    assert "deleted epoch 0 (node(s) trainer_0" in result.out
    storage = LocalPath(run_url)
    assert committed_epochs(storage) == [0, 1, 2, 3]  # trainer_1 is still in every epoch
    assert [committed_nodes(storage, epoch) for epoch in range(4)] == [{"trainer_1"}] * 3 + [
        {"trainer_0", "trainer_1"}
    ]
    assert sorted(p.name for p in Path(run_url).glob("trainer_0.*")) == ["trainer_0.3"]
    assert cli("verify", run_url).code == 0
    catalog = JsonCatalog()
    catalog.set_params(run_url, "npz", ["trainer_1"], storage=storage)
    assert catalog._read_entries()[0].nodes == ("trainer_1",)  # the catalog followed


def test_gc_applies_retention_then_frees_the_chunks_no_epoch_refers_to(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import numpy as np

    from ckptstore.protocol import _chunks
    from ckptstore.tree import load_tree, save_tree

    monkeypatch.setattr(_chunks, "PROBE_EVERY", 1)  # "new", changed whole, stays in the store

    url = str(tmp_path / "run")
    base = np.ones(1 << 18)  # 2 MiB, in every epoch
    for epoch in range(4):
        save_tree(url, epoch, {"base": base, "new": np.full(1 << 17, epoch)}, incremental=True)
    chunks = LocalPath(url).list_keys("_ckptstore/chunks")
    assert len(chunks) == 1 + 4
    dry = cli("gc", url, "--keep-last", "1", "--dry-run")
    assert dry.code == 0
    assert "would free 3 of 5 shared chunk(s), 3.0 MiB" in dry.out
    assert LocalPath(url).list_keys("_ckptstore/chunks") == chunks
    done = cli("gc", url, "--keep-last", "1", "--json")
    assert done.code == 0
    assert done.json()["chunks"]["chunks_freed"] == 3
    assert len(LocalPath(url).list_keys("_ckptstore/chunks")) == 2
    assert cli("verify", url).code == 0
    tree = load_tree(url, 3)
    assert isinstance(tree, dict)
    assert tree["new"].tolist() == [3] * (1 << 17)


def test_gc_collects_superseded_attempts_and_dry_run_only_shows_them(
    cli: Cli, tmp_path: Path
) -> None:
    url = str(tmp_path / "run")
    train(url, epochs=2)
    storage = LocalPath(url)
    lost = write_node(storage, "trainer_0", 1, {"w": np.ones(2)}, NpzDB(), ParallelIO())
    uncommitted = write_node(storage, "trainer_0", 9, {"w": np.ones(2)}, NpzDB(), ParallelIO())
    result = cli("gc", url, "--keep-last", "5", "--dry-run")
    assert result.code == 0
    assert f"would delete {lost.data_key} (not committed: lost a race or failed" in result.out
    assert "would delete 1 uncommitted attempt(s)" in result.out
    assert (tmp_path / "run" / lost.data_key).is_dir()
    result = cli("gc", url, "--keep-last", "5", "--json")
    assert result.code == 0
    assert [item["key"] for item in result.json()["garbage"]] == [lost.data_key]
    assert not (tmp_path / "run" / lost.data_key).exists()
    assert (tmp_path / "run" / uncommitted.data_key).is_dir()  # may still be written
    assert cli("verify", url).code == 0
    assert cli("gc", url, "--keep-last", "5", "--json").json()["garbage"] == []
