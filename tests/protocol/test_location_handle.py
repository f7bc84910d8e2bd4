"""The protocol's functions take the location whole, and still take a bare path type.

With a :class:`CheckpointLocation` the DB type, I/O settings and ``incremental`` flag
travel with the storage (issue 42, "One handle, passed forward"); a bare path type
still works for third-party callers that pass the format and engine themselves.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ckptstore import protocol
from ckptstore.builtin import LocalPath, NpzDB
from ckptstore.errors import JobConfigurationError
from ckptstore.io import ParallelIO
from ckptstore.protocol import CheckpointLocation, storage_of

BLOBS = {"trainer_0/w": np.arange(6.0).reshape(2, 3), "trainer_0/step": np.int64(7)}


def test_a_save_and_a_load_through_the_location_use_its_format(tmp_path: Path) -> None:
    location = CheckpointLocation.open(str(tmp_path), "npz")
    commit = protocol.write_node(location, "trainer_0", 3, BLOBS)
    assert commit.db_type == "npz"  # the location's DB type, not a default
    record = protocol.commit_epoch(location, 3, [commit])
    assert record.nodes["trainer_0"].attempt == commit.attempt  # returned, not read back
    assert protocol.committed_nodes(location, 3) == {"trainer_0"}
    assert protocol.CommitListing.of(location).newest_complete(["trainer_0"]) == 3
    manifest = protocol.open_node(location, "trainer_0", 3)
    loaded = protocol.read_blobs(location, manifest, None)
    np.testing.assert_array_equal(loaded["trainer_0/w"], BLOBS["trainer_0/w"])
    assert protocol.verify_node(location, "trainer_0", 3) == []
    protocol.retract_epoch(location, 3, ["trainer_0"])
    assert protocol.committed_nodes(location, 3) == set()


def test_the_location_s_incremental_flag_is_the_default(tmp_path: Path) -> None:
    location = CheckpointLocation.open(str(tmp_path), "npz", incremental=True)
    big = {"w": np.ones(1 << 18)}  # 2 MiB: above the incremental threshold
    commit = protocol.write_node(location, "trainer_0", 1, big)
    assert commit.shared_bytes > 0
    plain = protocol.write_node(location, "trainer_1", 1, big, incremental=False)
    assert plain.shared_bytes == 0


def test_a_bare_path_type_still_works_with_its_format_given(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    commit = protocol.write_node(storage, "trainer_0", 2, BLOBS, NpzDB(), ParallelIO())
    protocol.commit_epoch(storage, 2, [commit])
    location = CheckpointLocation.open(str(tmp_path), "npz")
    assert protocol.committed_nodes(storage, 2) == protocol.committed_nodes(location, 2)
    assert storage_of(location) is location.storage
    assert storage_of(storage) is storage


def test_a_bare_path_type_without_a_format_is_refused_by_name(tmp_path: Path) -> None:
    storage = LocalPath(str(tmp_path))
    with pytest.raises(JobConfigurationError, match=r"write_node\(\) on a bare path type"):
        protocol.write_node(storage, "trainer_0", 1, BLOBS)
    with pytest.raises(JobConfigurationError, match=r"check_can_hold\(\)"):
        protocol.check_can_hold(storage)
    assert storage.list_keys() == []  # nothing written
