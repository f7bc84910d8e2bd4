"""The standard checkpoint workloads, generated deterministically.

``mixed-1g``: 8 x 96 MiB, 200 x ~1 MiB, 2000 x 1-16 KiB float32 blobs (~0.96 GiB);
``mixed-4g``: the same mix scaled to ~4 GiB (more large blobs); ``tiny``: a few MiB with
the same shape of mix, for smoke runs.
"""

from __future__ import annotations

import numpy as np

MiB = 1 << 20
WORKLOADS = ("mixed-1g", "mixed-4g", "tiny")


def make_workload(name: str) -> dict[str, np.ndarray]:
    """The blobs of workload ``name`` (same values every time)."""
    big, mid, small, big_size = {
        "mixed-1g": (8, 200, 2000, 96 * MiB),
        "mixed-4g": (40, 200, 2000, 96 * MiB),
        "tiny": (2, 20, 200, 1 * MiB),
    }[name]
    rng = np.random.default_rng(20261122)
    blobs: dict[str, np.ndarray] = {}
    for i in range(big):
        blobs[f"layers.{i}.weight"] = rng.random(big_size // 4, dtype=np.float32)
    for i in range(mid):
        size = (MiB if name != "tiny" else 64 << 10) // 4 + int(rng.integers(0, 1024))
        blobs[f"mid.{i}.weight"] = rng.random(size, dtype=np.float32)
    for i in range(small):
        blobs[f"small.{i}.bias"] = rng.random(int(rng.integers(256, 4096)), dtype=np.float32)
    return blobs


def nbytes(blobs: dict[str, np.ndarray]) -> int:
    return sum(array.nbytes for array in blobs.values())
