"""Run the demo training job and SIGKILL this process at the K-th file-system call.

    python crash_child.py DIR DB_TYPE EPOCHS K [async]

K = 0 never kills; then the number of counted calls is printed at exit as
``calls=<n>``. Counted: opening for writing, writing, syncing, renaming, creating
(and linking) and deleting files and directories, including the buffered writes of
sequential formats, so a kill can land anywhere inside a save: data, manifest,
durability barrier, rename, commit record or catalog. With ``async`` the job saves asynchronously
(``JobRunner(async_save=True)``), so most kills land in a background writer thread
while the next epoch trains.
"""

from __future__ import annotations

import io
import os
import shutil
import sys
from functools import partial
from typing import Any

from kill_points import KillAt

from ckptstore.builtin import _local_path as local_path
from ckptstore.checkpoint import JobRunner
from ckptstore.tools import _demo
from ckptstore.tools._demo import DemoConfig, run_demo


def main() -> None:
    directory, db_type, epochs, kill_at = (
        sys.argv[1],
        sys.argv[2],
        int(sys.argv[3]),
        int(sys.argv[4]),
    )
    killer = KillAt(kill_at)
    counted = killer.counted
    plain_open = os.open
    count_open = counted(plain_open)

    def open_for_writing_counted(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        # reads change nothing on storage: only opens that can write are kill points
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC):
            return int(count_open(path, flags, *args, **kwargs))
        return plain_open(path, flags, *args, **kwargs)

    os.open = open_for_writing_counted  # type: ignore[assignment]
    for name in (
        "write",
        "writev",
        "pwritev",
        "fsync",
        "rename",
        "replace",
        "link",
        "mkdir",
        "unlink",
        "rmdir",
    ):
        setattr(os, name, counted(getattr(os, name)))
    os.makedirs = counted(os.makedirs)
    shutil.rmtree = counted(shutil.rmtree)
    if sys.argv[5:] == ["async"]:
        _demo.JobRunner = partial(JobRunner, async_save=True)  # type: ignore[misc]
    local_path._SyncingFileIO.write = counted(  # type: ignore[method-assign]
        local_path._SyncingFileIO.write
    )
    run_demo(DemoConfig(directory, epochs=epochs, db_type=db_type), io.StringIO())
    print(f"calls={killer.calls}")


if __name__ == "__main__":
    main()
