"""The GCS client's own aiohttp session (no gcsfs private methods)."""

from __future__ import annotations

import gc
import subprocess
import sys

from ckptstore_gcs import GCSPath


def test_a_closed_path_opens_a_new_session_when_used_again(gcs_url: str) -> None:
    storage = GCSPath(gcs_url)
    storage.write_bytes("a", b"first")
    storage.close()
    storage.close()  # closing twice is harmless
    storage.write_bytes("b", b"second")
    assert storage.read_bytes("a") == b"first"
    assert storage.read_bytes("b") == b"second"
    storage.close()


def test_a_script_that_never_closes_its_path_exits_without_aiohttp_warnings(
    gcs_url: str,
) -> None:
    """The session is closed at exit (and when the client is collected): aiohttp would
    otherwise print "Unclosed client session" as every such script ends."""
    script = (
        "from ckptstore_gcs import GCSPath\n"
        f"storage = GCSPath({gcs_url!r})\n"
        "storage.write_bytes('a', b'x')\n"
        "assert storage.read_bytes('a') == b'x'\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "Unclosed" not in result.stderr, result.stderr


def test_a_collected_client_closes_its_session(gcs_url: str) -> None:
    storage = GCSPath(gcs_url)
    storage.write_bytes("a", b"x")
    session = storage.client._session
    assert session is not None
    assert not session.closed
    del storage
    gc.collect()
    assert session.closed
