"""Kill points for the crash children (crash_child.py, retention_crash_child.py): count
the calls of wrapped functions and SIGKILL this process at the K-th."""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Callable
from typing import Any

from ckptstore.paths import _local_path as local_path


class KillAt:
    """Counts the calls of every function :meth:`counted` wraps; the ``kill_at``-th call
    (1-based; 0 never) kills this process with SIGKILL before it runs."""

    def __init__(self, kill_at: int) -> None:
        self.kill_at = kill_at
        self.calls = 0

    def counted(self, function: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            if self.calls == self.kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return function(*args, **kwargs)

        return wrapper


def count_file_system_writes(killer: KillAt) -> None:
    """Count, through ``killer``, every call that can change a local file system:
    opening for writing, writing, syncing, renaming, creating (and linking) and
    deleting files and directories, including the buffered writes of sequential
    formats, so a kill can land anywhere inside a save."""
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
    local_path._SyncingFileIO.write = counted(  # type: ignore[method-assign]
        local_path._SyncingFileIO.write
    )


S3_WRITES = frozenset(
    {
        "put_object",
        "create_multipart_upload",
        "upload_part",
        "complete_multipart_upload",
        "abort_multipart_upload",
        "copy_object",
        "delete_object",
        "delete_objects",
    }
)
"""The S3 API calls that can change a bucket."""


def count_s3_writes(killer: KillAt) -> None:
    """Count, through ``killer``, every S3 request of ckptstore's S3 plugin that can
    change the bucket (uploads, parts, deletes), so a kill lands before any of them is
    sent; requests of other threads already in flight are cut where they are."""
    from ckptstore_s3.client import S3Client

    call = S3Client.call

    async def counted_call(self: S3Client, method: str, describe: str, **params: Any) -> Any:
        if method in S3_WRITES:
            killer.calls += 1
            if killer.calls == killer.kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
        return await call(self, method, describe, **params)

    S3Client.call = counted_call  # type: ignore[method-assign]
