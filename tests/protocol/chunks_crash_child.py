"""Run a chunk collection (``gc``) or an incremental save (``save``) under DIR and
SIGKILL this process at the K-th file-system mutation (unlink, rename, link, replace).

    python chunks_crash_child.py DIR gc|save K
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent))

import numpy as np
from kill_points import KillAt

from ckptstore.builtin import LocalPath, ZarrDB
from ckptstore.io import ParallelIO
from ckptstore.protocol import collect_chunks, commit_epoch, write_node


def main() -> None:
    directory, what, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
    storage = LocalPath(directory)
    killer = KillAt(kill_at)
    for name in ("unlink", "rmdir", "rename", "replace", "link"):
        setattr(os, name, killer.counted(getattr(os, name)))
    if what == "gc":
        collect_chunks(storage)
    else:
        rng = np.random.default_rng(8)
        blobs = {"base": rng.standard_normal(1 << 18), "small": np.arange(3.0)}
        commit = write_node(storage, "t", 1, blobs, ZarrDB(), ParallelIO(), incremental=True)
        commit_epoch(storage, 1, [commit])
    print(f"calls={killer.calls}")


if __name__ == "__main__":
    main()
