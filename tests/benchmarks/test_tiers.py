"""The tiers benchmark's pieces: rounds pooled against the local-only saves of their own
round, and a moto server that keeps its objects off the disk the saves use."""

from __future__ import annotations

import contextlib
import os

import pytest
from ckptstore_s3 import S3Path

from benchmarks.object_store import IN_MEMORY
from benchmarks.tiers import Loop, local_saves, merged, round_ratios
from ckptstore.testing.servers import MotoServer


def loop(name: str, blocked: list[float], number: int) -> Loop:
    return Loop(name, blocked, wall=10.0 + number, lags=[1], copies=[2.0], round=number)


def test_rounds_of_a_row_are_pooled_and_each_is_judged_against_its_own_local_saves() -> None:
    runs = [
        loop("local only", [1.0, 1.0], 0),
        loop("local then S3", [1.2, 1.2], 0),
        loop("local only", [2.0, 2.0], 1),  # the machine slowed down in round 2
        loop("local then S3", [2.1, 2.1], 1),
    ]

    pooled = merged(runs)

    assert [row.name for row in pooled] == ["local only", "local then S3"]
    assert pooled[1].blocked == [1.2, 1.2, 2.1, 2.1]
    assert pooled[1].wall == 10.5  # the median of the rounds' wall times
    assert round_ratios(runs, "local then S3") == pytest.approx([1.2, 1.05])


def test_async_saves_are_judged_against_async_local_saves_only() -> None:
    runs = [
        loop("local only", [1.0], 0),
        loop("local only, save_async", [0.1], 0),
        loop("local then S3, save_async", [0.105], 0),
    ]

    assert local_saves(runs, "local then S3, save_async") == [0.1]
    assert local_saves(runs, "local then S3") == [1.0]
    assert round_ratios(runs, "local then S3, save_async") == pytest.approx([1.05])


def _deleted_files(pid: int) -> int:
    """Files the process holds open that have no name any more (temporary files)."""
    fds = f"/proc/{pid}/fd"
    deleted = 0
    for fd in os.listdir(fds):
        with contextlib.suppress(FileNotFoundError):  # closed since the listing
            deleted += os.readlink(f"{fds}/{fd}").endswith(" (deleted)")
    return deleted


@pytest.mark.parametrize(("env", "on_disk"), [(None, True), (IN_MEMORY, False)])
def test_moto_in_memory_writes_no_object_to_a_temporary_file(
    env: dict[str, str] | None, on_disk: bool
) -> None:
    with MotoServer(env=env) as server:
        server.create_bucket("bench")
        assert server.process is not None
        before = _deleted_files(server.process.pid)  # its log, which it inherits
        storage = S3Path("s3://bench/run", endpoint_url=server.endpoint_url, key="k", secret="s")
        storage.write_bytes("blob", b"x" * (6 << 20))  # over moto's 5 MiB buffer

        assert (_deleted_files(server.process.pid) > before) is on_disk
