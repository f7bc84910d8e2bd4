"""Real ext4 file systems on loop devices, for faults where they really happen.

:class:`Ext4Disk` makes an ext4 image (ext4's defaults: journal, delayed allocation;
4 KiB blocks, no root reserve, so free space is what ``statvfs`` says), attaches it to
a loop device and mounts it; :meth:`Ext4Disk.close` always unmounts and detaches, even
after a failure. Two real ways to make the device fail under the file system:

* ``thin_backing_bytes``: the image lives on a tmpfs of that size, smaller than the
  image (a thin-provisioned volume). ext4 believes it has room; the loop device's
  writes fail once the tmpfs is full, so the error surfaces late, at writeback or
  ``fsync`` (ext4 logs "I/O error 3 writing to inode"; userspace sees ENOSPC).
  :meth:`Ext4Disk.grow_backing` then adds room, as an operator extending the volume.
* :meth:`Ext4Disk.shut_down`: the ``EXT4_IOC_SHUTDOWN`` ioctl (xfstests' "godown"),
  without flushing the journal: from then on every operation on the file system fails
  with EIO, as on a device that died; :meth:`Ext4Disk.remount` replays the journal
  (what reached the device survives, as after a power loss).

The kernel here has no fault injection (``CONFIG_FAULT_INJECTION`` unset) and no
device-mapper, so dm-flakey, dm-error and ``fail_make_request`` are not available.

Loop devices need root. Where they cannot be used the fixture fails, naming the
reason; on such a machine, deselect these tests knowingly with ``-m "not loop_devices"``.
"""

from __future__ import annotations

import fcntl
import os
import struct
import subprocess
from pathlib import Path

import pytest

EXT4_IOC_SHUTDOWN = 0x8004587D  # _IOR('X', 125, __u32)
EXT4_GOING_FLAGS_NOLOGFLUSH = 2  # shut down without flushing the journal


def run(*command: str) -> str:
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({result.returncode}): {result.stderr}")
    return result.stdout.strip()


def require_loop_devices() -> None:
    """Fail where loop devices cannot be used, naming why."""
    reason = None
    if os.geteuid() != 0:
        reason = "the tests do not run as root (mount and losetup need it)"
    elif not Path("/dev/loop-control").exists():
        reason = "/dev/loop-control is missing (no loop driver in this kernel/container)"
    if reason is None:
        return
    pytest.fail(
        f"real-disk fault tests need loop devices, but {reason}; run as root on a machine "
        "with loop devices, or deselect them knowingly: pytest -m 'not loop_devices'"
    )


class Ext4Disk:
    """An ext4 file system of ``size_bytes`` on a loop device, mounted under ``workdir``."""

    def __init__(
        self, workdir: Path, size_bytes: int = 32 << 20, thin_backing_bytes: int | None = None
    ) -> None:
        self.workdir = workdir
        self.size_bytes = size_bytes
        self.thin_backing_bytes = thin_backing_bytes
        self.backing = workdir / "backing"
        self.image = self.backing / "ext4.img"
        self.mount = workdir / "mnt"
        self.device: str | None = None
        self._mounted = self._backing_mounted = False

    def open(self) -> Ext4Disk:
        try:
            self.backing.mkdir(parents=True)
            self.mount.mkdir()
            if self.thin_backing_bytes is not None:
                size = f"size={self.thin_backing_bytes}"
                run("mount", "-t", "tmpfs", "-o", size, "tmpfs", str(self.backing))
                self._backing_mounted = True
            with open(self.image, "wb") as image:
                image.truncate(self.size_bytes)
            run(
                *("mkfs.ext4", "-q", "-F", "-b", "4096", "-m", "0", "-J", "size=4"),
                *("-E", "nodiscard,lazy_itable_init=0,lazy_journal_init=0", str(self.image)),
            )
            self.device = run("losetup", "--find", "--show", str(self.image))
            self._mount()
        except BaseException:
            self.close()
            raise
        return self

    def _mount(self) -> None:
        assert self.device is not None
        # errors=continue: a write error does not remount read-only behind the test
        run("mount", "-t", "ext4", "-o", "errors=continue", self.device, str(self.mount))
        self._mounted = True

    def _unmount(self) -> None:
        if self._mounted:
            self._mounted = False
            try:
                run("umount", str(self.mount))
            except RuntimeError:  # still busy (a failed test left a file open): detach it
                run("umount", "--lazy", str(self.mount))
                raise

    def free_bytes(self) -> int:
        stats = os.statvfs(self.mount)
        return stats.f_bavail * stats.f_frsize

    def backing_used_bytes(self) -> int:
        stats = os.statvfs(self.backing)
        return (stats.f_blocks - stats.f_bfree) * stats.f_frsize

    def shut_down(self) -> None:
        """Make every later operation on the file system fail with EIO (journal not
        flushed: what was not yet written to the device is lost)."""
        fd = os.open(self.mount, os.O_RDONLY)
        try:
            fcntl.ioctl(fd, EXT4_IOC_SHUTDOWN, struct.pack("I", EXT4_GOING_FLAGS_NOLOGFLUSH))
        finally:
            os.close(fd)

    def grow_backing(self, size_bytes: int) -> None:
        """Give the thin backing volume ``size_bytes`` (an operator extending it)."""
        run("mount", "-o", f"remount,size={size_bytes}", str(self.backing))

    def remount(self) -> None:
        """Unmount, check and repair the file system (as a reboot would), mount again."""
        assert self.device is not None
        self._unmount()
        check = subprocess.run(
            ["e2fsck", "-f", "-y", self.device], capture_output=True, text=True, check=False
        )
        if check.returncode not in (0, 1):  # 1: errors corrected
            raise RuntimeError(f"e2fsck could not repair the disk: {check.stdout}{check.stderr}")
        self._mount()

    def close(self) -> None:
        """Unmount and detach whatever :meth:`open` set up (each step even if one fails)."""
        errors: list[str] = []
        for step in (self._unmount, self._detach, self._unmount_backing):
            try:
                step()
            except Exception as error:  # every step runs, all are reported
                errors.append(str(error))
        if errors:
            raise RuntimeError("; ".join(errors))

    def _detach(self) -> None:
        if self.device is not None:
            device, self.device = self.device, None
            run("losetup", "-d", device)

    def _unmount_backing(self) -> None:
        if self._backing_mounted:
            self._backing_mounted = False
            run("umount", str(self.backing))
