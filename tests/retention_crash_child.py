"""Run one job's retention on a shared prefix and SIGKILL this process at the K-th
file-system mutation.

    python retention_crash_child.py DIR NODE K

K = 0 never kills; then the number of counted calls is printed as ``calls=<n>``.
Counted: unlink, rmdir, rename, replace (every deletion, including each file that
``shutil.rmtree`` removes, and every atomic document write), so a kill can land between
any two steps of a deletion, or inside the deletion of one node checkpoint.
"""

from __future__ import annotations

import os
import sys

from kill_points import KillAt

from ckptstore.builtin._json_catalog import JsonCatalog
from ckptstore.checkpoint._retention import KeepLast, enforce
from ckptstore.paths._local_path import LocalPath


def main() -> None:
    directory, node, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
    storage = LocalPath(directory)
    catalog = JsonCatalog()
    catalog.set_params(directory, "npz", [node], storage=storage)
    killer = KillAt(kill_at)
    for name in ("unlink", "rmdir", "rename", "replace"):
        setattr(os, name, killer.counted(getattr(os, name)))
    enforce(storage, KeepLast(1), nodes=[node], handler=catalog)
    print(f"calls={killer.calls}")


if __name__ == "__main__":
    main()
