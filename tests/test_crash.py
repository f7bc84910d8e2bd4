"""SIGKILL a real training job at random moments, most of them inside saves, re-run it,
and check that every resume lands on a complete checkpoint with the right values and
that the job still ends exactly where an uninterrupted run does.

``CKPTSTORE_CRASH_KILLS`` sets the number of kills per DB type (default 12) and
``CKPTSTORE_CRASH_SEED`` the random seed (default 0), for longer or different soaks.
"""

from __future__ import annotations

import io
import os
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ckptstore.builtin import LocalPath
from ckptstore.builtin._json_catalog import JsonCatalog
from ckptstore.io import ParallelIO
from ckptstore.plugin import get_registry
from ckptstore.protocol._commit import open_node, read_blobs, verify_node
from ckptstore.records._layout import (
    CONTROL_DIR,
    RETIRED_MARK,
    STAGING_MARK,
    parse_commit_record_key,
    parse_db_key,
)
from ckptstore.tools._demo import DemoConfig, run_demo

CHILD = Path(__file__).with_name("crash_child.py")
EPOCHS = 12
NODES = [f"trainer_{k}" for k in range(3)]
KILLS = int(os.environ.get("CKPTSTORE_CRASH_KILLS", "12"))
SEED = os.environ.get("CKPTSTORE_CRASH_SEED", "0")


def local_db_types() -> list[str]:
    return sorted(get_registry().db_types)


def run_child(
    directory: Path, db_type: str, kill_at: int, timeout: float | None = None, mode: str = "sync"
) -> str:
    """Run the job; kill it at call ``kill_at`` (0: never) or after ``timeout`` s.
    ``mode`` "async" saves asynchronously (kills then land in background writes)."""
    process = subprocess.Popen(
        [sys.executable, str(CHILD), str(directory), db_type, str(EPOCHS), str(kill_at), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout if timeout is not None else 120)
    except subprocess.TimeoutExpired:
        process.kill()  # the random moment chosen by the parent
        stdout, stderr = process.communicate()
    if process.returncode not in (0, -9):
        raise AssertionError(f"child failed ({process.returncode}):\n{stderr}")
    return stdout


def state(storage: LocalPath, epoch: int) -> dict[str, np.ndarray]:
    db_types = get_registry()
    blobs: dict[str, np.ndarray] = {}
    for node in NODES:
        manifest = open_node(storage, node, epoch)
        reader = db_types.db_type(manifest.db_type)
        assert verify_node(storage, node, epoch, reader, ParallelIO()) == []
        blobs.update(read_blobs(storage, manifest, None, reader, ParallelIO()))
    return blobs


def unfinished_save_left(storage: LocalPath) -> bool:
    """Whether the kill interrupted a save: a staging directory, a node checkpoint of an
    epoch that is not committed for that node, or a commit the catalog has not recorded
    yet was left behind."""
    committed = committed_epochs(storage)
    if committed and resume_point(storage) != committed[-1]:
        return True
    for name in os.listdir(storage.root):
        if STAGING_MARK in name:
            return True
        parsed = parse_db_key(name)
        if parsed is not None and parsed[0] not in _committed_nodes(storage, parsed[1]):
            return True
    return False


def committed_epochs(storage: LocalPath) -> list[int]:
    epochs = {parse_commit_record_key(key) for key in storage.list_keys(CONTROL_DIR)}
    return sorted(epoch for epoch in epochs if epoch is not None)


def resume_point(storage: LocalPath) -> int | None:
    catalog = JsonCatalog()
    catalog.set_params(storage.url, "", NODES, storage=storage)
    return catalog.last_epoch()


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("db_type", local_db_types())
def test_sigkill_never_leaves_a_resumable_broken_checkpoint(
    tmp_path: Path, db_type: str, mode: str
) -> None:
    reference = tmp_path / "reference"
    run_demo(DemoConfig(str(reference), epochs=EPOCHS, db_type=db_type), io.StringIO())
    reference_storage = LocalPath(str(reference))
    started = time.perf_counter()
    total_calls = int(
        re.search(r"calls=(\d+)", run_child(tmp_path / "count", db_type, 0, mode=mode))[1]
    )
    run_seconds = time.perf_counter() - started

    rng = random.Random(f"crash-{db_type}-{SEED}" + ("" if mode == "sync" else f"-{mode}"))
    crashed = tmp_path / "crashed"
    storage = LocalPath(str(crashed))
    kills_inside_saves = 0
    timed_kills = 0
    for kill in range(KILLS):
        before = resume_point(storage) if crashed.exists() else None
        if before == EPOCHS:  # a run got to the end: start over, so every kill counts
            shutil.rmtree(crashed)
            before = None
        done = 0 if before is None else before + 1
        remaining_calls = max(1, total_calls * (EPOCHS + 1 - done) // (EPOCHS + 1))
        if kill % 4 == 3:  # a kill at an arbitrary moment: training, saving, starting up
            timed_kills += 1
            run_child(crashed, db_type, 0, timeout=rng.uniform(0.2, 1.0) * run_seconds, mode=mode)
        else:  # a kill at a random file-system call: always inside a save
            run_child(crashed, db_type, rng.randint(1, remaining_calls), mode=mode)
            if unfinished_save_left(storage):
                kills_inside_saves += 1
        leftovers = [name for name in os.listdir(crashed) if RETIRED_MARK in name]
        assert len(leftovers) <= len(NODES), f"retired copies pile up: {leftovers}"

        resume = resume_point(storage)
        if before is not None:
            assert resume is not None
            assert resume >= before, "resume went backwards"
        if resume is not None:
            # the epoch a resume picks is committed on every node
            assert set(NODES) <= set(_committed_nodes(storage, resume))
        for epoch in committed_epochs(storage):
            # every node checkpoint that is committed is complete and right, whatever was
            # killed (per-node commit records: a kill between two nodes' records leaves an
            # epoch committed on some nodes only, which no resume of this job picks)
            if not set(NODES) <= set(_committed_nodes(storage, epoch)):
                continue
            expected = state(reference_storage, epoch)
            found = state(storage, epoch)
            assert found.keys() == expected.keys()
            for name, value in expected.items():
                assert np.array_equal(found[name], value), (epoch, name)

    final = run_child(crashed, db_type, 0, mode=mode)
    assert "calls=" in final
    assert resume_point(storage) == EPOCHS
    for name, value in state(reference_storage, EPOCHS).items():
        assert np.array_equal(state(storage, EPOCHS)[name], value), name
    # some file-system calls leave no trace (the first open of a save, a finished
    # catalog write); most must have interrupted a save visibly
    assert kills_inside_saves >= (KILLS - timed_kills) // 2, "too few kills landed in a save"


def _committed_nodes(storage: LocalPath, epoch: int) -> set[str]:
    from ckptstore.protocol._commit import committed_nodes

    return committed_nodes(storage, epoch)
