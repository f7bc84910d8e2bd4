"""Every named attack (tests/attacks/attacks.py) fails cleanly, on every path an
operator or a job takes: ``MultiNodeCheckpointManager.load`` raises
CorruptCheckpointError naming the epoch (never a CRC value) within a bounded amount of
memory, a ``JobRunner`` resume falls back to the newest intact epoch, ``ckptstore
verify/inspect/convert/cp`` exit with the documented code and one line, and nothing
outside the prefix is opened, read or written (inotify sees every access).

The compression bombs (tests/attacks/bombs.py) expand to gigabytes: their tests run under
an address-space guard, and a load must refuse one by its bound, in the memory its stored
frame takes, never by running out of memory."""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pytest

from ckptstore.checkpoint._multinode import MultiNodeCheckpointManager
from ckptstore.checkpoint._runner import JobRunner
from ckptstore.cli import main
from ckptstore.cli._common import EXIT_CORRUPT, EXIT_NOT_FOUND
from ckptstore.errors import CheckpointNotFoundError, CkptStoreError, CorruptCheckpointError
from ckptstore.execution._session import LocalSession
from ckptstore.formats._zarr_db import ZarrDB
from ckptstore.plugin._db_type import DBType
from ckptstore.testing.conformance.jobs import NODES, counting_job
from tests.attacks.attacks import ATTACKS, Spec
from tests.attacks.bombs import (
    BLOSC_BOMB_BYTES,
    BOMBS,
    address_space_guard,
    blosc_zeros_frame,
    zstd_zeros_frame,
)
from tests.attacks.forge import EPOCH, Forge, OutsideWatch

MEMORY_BOUND = 128 << 20  # peak Python/numpy allocations while loading a forgery
BOMB_OVERHEAD = 1 << 20
"""What loading a bomb may allocate beyond its chunk (stored frame and declared size)."""

ALL_ATTACKS = {**ATTACKS, **BOMBS}
CASES = [
    pytest.param((name, fmt), id=f"{name}-{fmt}")
    for name, spec in ALL_ATTACKS.items()
    for fmt in spec.formats
]


def db_type(fmt: str) -> DBType | str:
    if fmt.startswith("zarr-"):
        return ZarrDB(compression=fmt.removeprefix("zarr-"))
    return fmt


def out_of_memory(error: BaseException | None) -> bool:
    """Whether ``error``, or an error it was raised from or while handling, is a
    MemoryError (a bomb decoded beyond its bound, stopped by the guard)."""
    while error is not None:
        if isinstance(error, MemoryError):
            return True
        error = error.__cause__ or error.__context__
    return False


@dataclass
class Forged:
    name: str
    run: Path
    outside: Path
    spec: Spec
    fmt: str
    crcs: set[int]
    watch: OutsideWatch
    before: dict[str, tuple[bytes, int]]

    def manager(self, **options: Any) -> MultiNodeCheckpointManager:
        return MultiNodeCheckpointManager(str(self.run), db_type(self.fmt), **options)

    def assert_outside_untouched(self) -> None:
        if not self.spec.reads_inode:  # a hard link is read as stored bytes, by design
            assert self.watch.events() == 0, "something outside the prefix was accessed"
        after = {
            path.name: (path.read_bytes(), path.stat().st_mtime_ns)
            for path in sorted(self.outside.rglob("*"))
            if path.is_file()
        }
        assert after == self.before, "something outside the prefix was written"


@pytest.fixture(params=CASES)
def forged(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Forged]:
    name, fmt = request.param
    spec = ALL_ATTACKS[name]
    run, outside = tmp_path / "run", tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(os.urandom(4096))
    manager = MultiNodeCheckpointManager(str(run), db_type(fmt), metadata_handler="json")
    assert JobRunner(counting_job(epochs=EPOCH), manager).train(LocalSession()) == EPOCH
    forge = Forge(run)
    crcs = forge.recorded_crcs()
    spec.attack(forge, outside)
    before = {
        path.name: (path.read_bytes(), path.stat().st_mtime_ns)
        for path in sorted(outside.rglob("*"))
        if path.is_file()
    }
    watch = OutsideWatch(outside)
    with address_space_guard() if name in BOMBS else contextlib.nullcontext():
        yield Forged(name, run, outside, spec, fmt, crcs, watch, before)
    watch.close()


def test_load_raises_a_typed_error_in_bounded_memory(forged: Forged) -> None:
    manager = forged.manager()
    session = LocalSession()
    tracemalloc.start()
    try:
        with pytest.raises(CkptStoreError) as caught:  # noqa: PT012 (init and load: one load)
            session.run(manager.init(list(NODES), retrieve_from_epoch=EPOCH))
            session.run(manager.load(EPOCH))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    error = caught.value
    expected = (CorruptCheckpointError, CheckpointNotFoundError)
    assert isinstance(error, expected if forged.spec.whole_run else CorruptCheckpointError)
    message = str(error)
    assert "\n" not in message
    assert f"epoch {EPOCH}" in message or f"epoch-{EPOCH}" in message
    for crc in forged.crcs:
        assert str(crc) not in message
        assert f"{crc:08x}" not in message.lower()
    assert peak < MEMORY_BOUND
    if forged.name in BOMBS:  # refused before decoding: it never expanded
        assert not out_of_memory(error), "the bomb was decoded beyond the chunk's bound"
        _, _, stored, declared, _ = Forge(forged.run).blob()[1]["chunks"][0]
        assert peak < stored + declared + BOMB_OVERHEAD
    forged.assert_outside_untouched()


def test_resume_falls_back_to_the_newest_intact_epoch(
    forged: Forged, caplog: pytest.LogCaptureFixture
) -> None:
    # the job's own epoch counter is restored too: resumed from epoch 1, it ends at 2
    runner = JobRunner(counting_job(epochs=EPOCH), forged.manager(metadata_handler="json"))
    if forged.spec.whole_run:  # no intact epoch is left: a typed error, nothing else
        with pytest.raises(CkptStoreError):
            runner.train(LocalSession())
    else:
        with caplog.at_level(logging.WARNING):
            assert runner.train(LocalSession()) == EPOCH
        if runner.restore_failures:  # the load of epoch 2 failed: the runner fell back
            assert [failure.epoch for failure in runner.restore_failures] == [EPOCH]
            assert isinstance(runner.restore_failures[0].error, CorruptCheckpointError)
            assert not out_of_memory(runner.restore_failures[0].error)
            assert f"Epoch {EPOCH} cannot be restored" in caplog.text
        else:  # its commit record is unreadable: the catalog skipped it, loudly
            assert f"skipping epoch {EPOCH}" in caplog.text.lower()
        # epoch 2 was saved again, intact, over the forgery
        session = LocalSession()
        manager = forged.manager()
        session.run(manager.init(list(NODES), retrieve_from_epoch=EPOCH))
        session.run(manager.load(EPOCH))
    forged.assert_outside_untouched()


@pytest.mark.parametrize("command", ["verify", "inspect", "convert", "cp"])
def test_cli_exits_corrupt_with_one_line(
    forged: Forged, command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = str(forged.run)
    other = "npz" if forged.fmt != "npz" else "zarr"
    argv = {
        "verify": ["verify", run, "--epoch", str(EPOCH)],
        "inspect": ["inspect", run, "--epoch", str(EPOCH)],
        "convert": [
            "convert",
            run,
            "--to",
            other,
            "--epoch",
            str(EPOCH),
            "--dest",
            str(tmp_path / "c"),
        ],
        "cp": ["cp", run, str(tmp_path / "copy"), "--epoch", str(EPOCH)],
    }[command]
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert len(err.strip().splitlines()) <= 1
    if forged.spec.whole_run:
        assert code in (EXIT_CORRUPT, EXIT_NOT_FOUND)
    elif command == "inspect" and not forged.spec.in_manifest:
        assert code == 0  # inspect reads manifests only, and the manifest is intact
    else:
        assert code == EXIT_CORRUPT, (out, err)
    forged.assert_outside_untouched()


def test_an_explicitly_requested_forged_epoch_raises(tmp_path: Path) -> None:
    """No fallback when the user named the epoch: the typed error reaches them."""
    run = tmp_path / "run"
    manager = MultiNodeCheckpointManager(str(run), "zarr", metadata_handler="json")
    assert JobRunner(counting_job(epochs=EPOCH), manager).train(LocalSession()) == EPOCH
    ATTACKS["shape_10e12"].attack(Forge(run), tmp_path)
    manager = MultiNodeCheckpointManager(str(run), "zarr", metadata_handler="json")
    runner = JobRunner(counting_job(epochs=EPOCH), manager, resume_from_epoch=EPOCH)
    with pytest.raises(CorruptCheckpointError, match=f"epoch {EPOCH}"):
        runner.train(LocalSession())


def test_a_zstd_bomb_frame_is_a_valid_frame() -> None:
    """The zstd bomb is a frame that decodes (to zeros): nothing but the bound stops it."""
    decoded = numcodecs.Zstd().decode(zstd_zeros_frame(1 << 20))
    assert np.array_equal(np.frombuffer(decoded, np.uint8), np.zeros(1 << 20, np.uint8))


def test_a_blosc_bomb_frame_is_whole() -> None:
    """The blosc bomb's header declares its 2 GiB and every byte of the frame stored."""
    frame = blosc_zeros_frame()
    nbytes, _, cbytes = struct.unpack_from("<III", frame, 4)  # and the block size
    assert (nbytes, cbytes) == (BLOSC_BOMB_BYTES, len(frame))
