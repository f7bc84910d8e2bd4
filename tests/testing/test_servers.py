"""The server helpers start real subprocesses on 127.0.0.1, wait until they answer,
report why they did not start, and restart on the same port."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from ckptstore.testing import GcsEmulator, MotoServer, ServerProcess, free_port, wait_for


class _Exits(ServerProcess):
    kind = "exiting"

    def command(self) -> list[str]:
        return [sys.executable, "-c", "print('cannot bind: boom'); raise SystemExit(3)"]


class _Silent(ServerProcess):
    kind = "silent"

    def command(self) -> list[str]:
        return [sys.executable, "-c", "import time; time.sleep(60)"]


def test_moto_starts_answers_and_forgets_everything_on_restart() -> None:
    with MotoServer() as server:
        assert server.endpoint_url.startswith("http://127.0.0.1:")
        assert server.answers()
        server.create_bucket("kept")
        status, _ = server.request(
            "PUT",
            "/kept/a",
            b"x",
            {
                "Authorization": "AWS4-HMAC-SHA256 "
                "Credential=k/20240101/us-east-1/s3/aws4_request, "
                "SignedHeaders=host, Signature=0"
            },
        )
        assert status == 200
        assert server.object_keys("kept") == ["a"]
        port = server.port
        server.stop()
        assert not server.running
        assert not server.answers()
        server.start()
        assert server.port == port
        assert server.answers()
        assert server.object_keys("kept") == []  # moto keeps nothing across a restart
    assert not server.running


def test_delete_bucket_removes_its_objects() -> None:
    with MotoServer() as server:
        server.create_bucket("gone")
        for key in ("a", "b/c"):
            server.request(
                "PUT",
                f"/gone/{key}",
                b"1",
                {
                    "Authorization": "AWS4-HMAC-SHA256 Credential=k/20240101/us-east-1/s3/"
                    "aws4_request, SignedHeaders=host, Signature=0"
                },
            )
        assert server.object_keys("gone") == ["a", "b/c"]
        server.delete_bucket("gone")
        assert server.object_keys("gone") == []
        server.delete_bucket("never-existed")


def test_gcs_emulator_keeps_objects_across_a_restart_with_a_data_dir(tmp_path: Path) -> None:
    with GcsEmulator(data_dir=tmp_path / "data") as server:
        server.create_bucket("kept")
        status, _ = server.request(
            "POST",
            "/upload/storage/v1/b/kept/o?uploadType=media&name=x%2Fy",
            b"payload",
            {"Content-Type": "application/octet-stream"},
        )
        assert status == 200
        server.restart()
        assert server.object_keys("kept") == ["x/y"]
        server.delete_bucket("kept")
        assert server.object_keys("kept") == []


def test_a_server_that_exits_at_startup_reports_its_output() -> None:
    server = _Exits(startup_timeout=30)
    with pytest.raises(
        RuntimeError, match=r"exited with code 3 while starting:\ncannot bind: boom"
    ):
        server.start()


def test_a_with_block_whose_start_fails_closes_the_server_and_its_log() -> None:
    server = _Exits(startup_timeout=30)
    with pytest.raises(RuntimeError, match="exited with code 3"), server:
        pytest.fail("the block must not run when the server did not start")
    assert (server.process, server.log_tail()) == (None, "")


def test_a_server_that_never_answers_times_out_and_is_stopped() -> None:
    server = _Silent(startup_timeout=0.5)
    with pytest.raises(TimeoutError, match=r"did not answer on http://127.0.0.1:\d+ within 0 s"):
        server.start()
    assert not server.running


def test_another_host_needs_an_explicit_port() -> None:
    with pytest.raises(ValueError, match="give the moto S3 server a port"):
        MotoServer(host="10.200.0.2").start()


def test_free_port_is_bindable_and_wait_for_times_out() -> None:
    port = free_port()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", port))
    with pytest.raises(TimeoutError, match="waiting for the impossible"):
        wait_for(lambda: False, timeout=0.1, what="the impossible")
    calls = iter([False, False, True])
    wait_for(lambda: next(calls), timeout=5, what="the third call")
