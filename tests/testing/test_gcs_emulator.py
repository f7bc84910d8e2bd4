"""The GCS emulator launcher writes every file whole, so a server stopped at any moment
(even SIGKILL mid-write) restarts with every object it acknowledged; with
``enforce_preconditions`` it honours ``ifGenerationMatch`` as GCS does."""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from ckptstore.testing import GcsEmulator, wait_for
from ckptstore.testing.gcs_emulator import make_writes_atomic


@pytest.fixture
def file_store_class() -> Iterator[type]:
    from gcp_storage_emulator import storage

    original = storage._FileStore.write_bytes
    make_writes_atomic()
    yield storage._FileStore
    storage._FileStore.write_bytes = original


def test_a_write_that_fails_midway_leaves_the_previous_file_whole(
    file_store_class: type, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = file_store_class(use_memory=False, root=tmp_path)
    store.write_bytes(".meta", b'{"old": true}')
    real_write = Path.write_bytes

    def write_half_then_fail(path: Path, data: bytes) -> int:
        real_write(path, data[: len(data) // 2])
        raise OSError("disk full")

    monkeypatch.setattr(Path, "write_bytes", write_half_then_fail)
    with pytest.raises(OSError, match="disk full"):
        store.write_bytes(".meta", b'{"new": "a longer document"}')
    monkeypatch.undo()
    assert store.read_bytes(".meta") == b'{"old": true}'
    assert sorted(os.listdir(tmp_path)) == [".meta"]


def test_writes_land_in_nested_directories_and_memory_stores_are_untouched(
    file_store_class: type, tmp_path: Path
) -> None:
    on_disk = file_store_class(use_memory=False, root=tmp_path)
    on_disk.write_bytes("bucket/a/b", b"payload")
    assert (tmp_path / "bucket" / "a" / "b").read_bytes() == b"payload"
    assert os.listdir(tmp_path / "bucket" / "a") == ["b"]
    in_memory = file_store_class(use_memory=True)
    in_memory.write_bytes("bucket/x", b"kept in memory")
    assert in_memory.read_bytes("bucket/x") == b"kept in memory"


def _upload_until_refused(
    server: GcsEmulator, prefix: str, stop: threading.Event, acknowledged: list[str]
) -> None:
    """Upload small objects until ``stop`` is set or the server stops answering."""
    index = 0
    while not stop.is_set():
        name = f"{prefix}-{index:05d}"
        try:
            status, _ = server.request(
                "POST",
                f"/upload/storage/v1/b/kept/o?uploadType=media&name={name}",
                b"x" * 4096,
                {"Content-Type": "application/octet-stream"},
                timeout=5.0,
            )
        except OSError:
            return
        if status == 200:
            acknowledged.append(name)
        index += 1


def _kill_while_uploading(server: GcsEmulator, prefix: str, acknowledged: list[str]) -> None:
    """SIGKILL the server (no chance to finish a write) once 150 more uploads landed."""
    stop = threading.Event()
    uploader = threading.Thread(
        target=_upload_until_refused, args=(server, prefix, stop, acknowledged)
    )
    target = len(acknowledged) + 150
    uploader.start()
    wait_for(lambda: len(acknowledged) >= target, timeout=120, what="uploads")
    assert server.process is not None
    os.killpg(server.process.pid, signal.SIGKILL)
    server.stop()
    stop.set()
    uploader.join(timeout=30)
    assert not uploader.is_alive()


def test_killed_while_uploading_the_emulator_restarts_with_every_acknowledged_object(
    tmp_path: Path,
) -> None:
    with GcsEmulator(data_dir=tmp_path / "data") as server:
        server.create_bucket("kept")
        acknowledged: list[str] = []
        for round_number in range(6):
            _kill_while_uploading(server, f"r{round_number}", acknowledged)
            server.start()  # raised JSONDecodeError when the index was left half-written
            assert set(acknowledged) <= set(server.object_keys("kept"))


def _upload(server: GcsEmulator, name: str, body: bytes, generation: str | None) -> int:
    query = f"uploadType=media&name={name}"
    if generation is not None:
        query += f"&ifGenerationMatch={generation}"
    status, _ = server.request("POST", f"/upload/storage/v1/b/pre/o?{query}", body)
    return status


def _generation(server: GcsEmulator, name: str) -> str:
    status, body = server.request("GET", f"/storage/v1/b/pre/o/{name}")
    assert status == 200, body
    return str(json.loads(body)["generation"])


def test_the_enforcing_emulator_answers_412_unless_the_generation_matches() -> None:
    with GcsEmulator(enforce_preconditions=True) as server:
        server.create_bucket("pre")
        assert _upload(server, "k", b"1", "0") == 200  # absent: created
        assert _upload(server, "k", b"2", "0") == 412  # exists: refused
        first = _generation(server, "k")
        assert _upload(server, "k", b"3", "12345") == 412  # another generation: refused
        assert _upload(server, "k", b"4", first) == 200  # the current one: replaced
        assert _upload(server, "k", b"5", first) == 412  # now stale
        assert _upload(server, "k", b"6", None) == 200  # unconditional uploads still go
        status, body = server.request("GET", "/download/storage/v1/b/pre/o/k?alt=media")
        assert (status, body) == (200, b"6")
        boundary = "b0undary"
        multipart = (
            f"--{boundary}\r\nContent-Type: application/json\r\n\r\n"
            '{"name": "m"}\r\n'
            f"--{boundary}\r\nContent-Type: application/octet-stream\r\n\r\nx\r\n"
            f"--{boundary}--\r\n"
        ).encode()
        target = "/upload/storage/v1/b/pre/o?uploadType=multipart&ifGenerationMatch=0"
        headers = {"Content-Type": f"multipart/related; boundary={boundary}"}
        assert server.request("POST", target, multipart, headers)[0] == 200
        assert server.request("POST", target, multipart, headers)[0] == 412  # named in metadata


def test_the_plain_emulator_still_ignores_the_precondition() -> None:
    with GcsEmulator() as server:  # what the ordinary gcs_server fixture runs
        server.create_bucket("pre")
        assert _upload(server, "k", b"1", "0") == 200
        assert _upload(server, "k", b"2", "0") == 200
