"""A job of tests/test_stateful_protocol.py, killed with SIGKILL at its K-th
mutating file-system call.

    python stateful_child.py ROOT DB_TYPE EPOCHS KILL_AT sync|async

Runs the one-node job of fault_helpers.py to EPOCHS under ROOT (resuming from the
newest committed epoch, lease TTL 2 s). Counted like crash_child.py: opens for
writing, writes, fsyncs, renames, links, mkdirs and deletes. KILL_AT = 0, or more
calls than the run makes, never kills: the run then prints ``committed=<epochs>``.
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import Any

from fault_helpers import build_job
from kill_points import KillAt

from ckptstore import JobRunner, LocalSession, MultiNodeCheckpointManager


def main() -> None:
    root, db_type, epochs, kill_at, mode = sys.argv[1:6]
    killer = KillAt(int(kill_at))
    plain_open = os.open
    count_open = killer.counted(plain_open)

    def open_counted(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC):
            return int(count_open(path, flags, *args, **kwargs))
        return plain_open(path, flags, *args, **kwargs)

    os.open = open_counted  # type: ignore[assignment]
    for name in ("write", "pwrite", "pwritev", "fsync", "rename", "replace", "link", "mkdir"):
        setattr(os, name, killer.counted(getattr(os, name)))
    for name in ("unlink", "rmdir", "makedirs"):
        setattr(os, name, killer.counted(getattr(os, name)))
    shutil.rmtree = killer.counted(shutil.rmtree)
    manager = MultiNodeCheckpointManager(root, db_type, "json")
    runner = JobRunner(
        build_job(int(epochs)), manager, lease_ttl=2, retry_backoff=0, async_save=mode == "async"
    )
    runner.train(LocalSession())
    print(f"committed={','.join(map(str, runner.committed_epochs))}", flush=True)


if __name__ == "__main__":
    main()
