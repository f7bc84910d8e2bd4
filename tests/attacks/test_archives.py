"""Packed archives whose ZIP structure is forged (docs/security.md): every checksum is
recomputed, so loads and a plain ``verify`` (which never read the ZIP structure) see an
intact epoch, but zarr, numpy or ``zipfile`` opening the archive as
docs/reading-without-ckptstore.md shows would meet ``../`` names or a member said to
inflate to 1 GiB. ``verify --deep`` reports it (exit 3), and ``cp`` and ``convert``
refuse it (exit 3, nothing committed at the destination)."""

from __future__ import annotations

import io
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from ckptstore.checkpoint._multinode import MultiNodeCheckpointManager
from ckptstore.checkpoint._runner import JobRunner
from ckptstore.cli import main
from ckptstore.cli._common import EXIT_CORRUPT
from ckptstore.execution._session import LocalSession
from ckptstore.paths._local_path import LocalPath
from ckptstore.protocol import read_commit
from ckptstore.testing.conformance.jobs import counting_job
from tests.attacks.forge import EPOCH, Forge

ARCHIVES = {"zarr": "blobs.zarr.zip", "npz": "blobs.npz"}


def _rename_member(archive: bytes) -> bytes:
    """The last member renamed so that it starts with ``../`` (in both its headers)."""
    name = zipfile.ZipFile(io.BytesIO(archive)).namelist()[-1].encode()
    assert archive.count(name) == 2
    return archive.replace(name, b"../" + name[3:])


def _gigabyte_member(archive: bytes) -> bytes:
    """A deflated member (a zarr.json) said to inflate to 1 GiB, in both its headers."""
    infos = zipfile.ZipFile(io.BytesIO(archive)).infolist()
    info = next(
        i for i in infos if i.compress_type == 8 and archive.count(i.filename.encode()) == 2
    )
    out = bytearray(archive)
    struct.pack_into("<I", out, info.header_offset + 22, 1 << 30)  # local header
    central = archive.rindex(info.filename.encode()) - 46
    assert archive[central : central + 4] == b"PK\x01\x02"
    struct.pack_into("<I", out, central + 24, 1 << 30)
    return bytes(out)


FORGERIES: dict[str, tuple[Callable[[bytes], bytes], tuple[str, ...]]] = {
    "traversal_member_name": (_rename_member, ("zarr", "npz")),
    "gigabyte_deflated_member": (_gigabyte_member, ("zarr",)),
}
CASES = [
    pytest.param((name, fmt), id=f"{name}-{fmt}")
    for name, (_, formats) in FORGERIES.items()
    for fmt in formats
]


@pytest.fixture
def forged_run(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    name, fmt = request.param
    run = tmp_path / "run"
    manager = MultiNodeCheckpointManager(str(run), fmt, metadata_handler="json")
    assert JobRunner(counting_job(epochs=EPOCH), manager).train(LocalSession()) == EPOCH
    forge = Forge(run)
    archive = forge.db / ARCHIVES[fmt]
    archive.write_bytes(FORGERIES[name][0](archive.read_bytes()))
    forge.resign_all()  # every checksum matches the forgery
    return run


@pytest.mark.parametrize("forged_run", CASES, indirect=True)
def test_verify_deep_reports_it_and_cp_and_convert_refuse_it(
    forged_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = str(forged_run)
    assert main(["verify", run, "--epoch", str(EPOCH)]) == 0  # checksums only: they match
    capsys.readouterr()
    assert main(["verify", run, "--epoch", str(EPOCH), "--deep"]) == EXIT_CORRUPT
    out, err = capsys.readouterr()
    assert "BROKEN  epoch 2 node trainer_0" in out
    assert "not a ZIP archive other readers may open safely" in out
    copy, converted = tmp_path / "copy", tmp_path / "converted"
    assert main(["cp", run, str(copy), "--epoch", str(EPOCH)]) == EXIT_CORRUPT
    argv = ["convert", run, "--to", "npz", "--epoch", str(EPOCH), "--dest", str(converted)]
    assert main(argv) == EXIT_CORRUPT
    argv = ["convert", run, "--to", "lmdb", "--epoch", str(EPOCH)]  # in place
    assert main(argv) == EXIT_CORRUPT
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert all(len(line) < 1000 for line in err.splitlines())
    for dest in (copy, converted):
        assert read_commit(LocalPath(str(dest)), EPOCH) is None
    assert main(["verify", run, "--epoch", str(EPOCH - 1), "--deep"]) == 0  # intact
