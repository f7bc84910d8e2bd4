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
import sys
from functools import partial

from kill_points import KillAt, count_file_system_writes

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
    count_file_system_writes(killer)
    if sys.argv[5:] == ["async"]:
        _demo.JobRunner = partial(JobRunner, async_save=True)  # type: ignore[misc]
    run_demo(DemoConfig(directory, epochs=epochs, db_type=db_type), io.StringIO())
    print(f"calls={killer.calls}")


if __name__ == "__main__":
    main()
