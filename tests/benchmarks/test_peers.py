"""The tools as the benchmarks run them: ckptstore's unchecked load leaves nothing set for
the tools after it."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from benchmarks.peers import ckptstore_load, ckptstore_save


def test_an_unchecked_load_leaves_the_next_load_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CKPTSTORE_IO_VERIFY", raising=False)
    blobs = {"w": np.arange(1000, dtype=np.float32)}
    ckptstore_save("zarr", blobs, tmp_path)
    loaded = ckptstore_load("zarr", blobs, tmp_path, verify=False)
    np.testing.assert_array_equal(loaded["w"], blobs["w"])
    assert "CKPTSTORE_IO_VERIFY" not in os.environ
