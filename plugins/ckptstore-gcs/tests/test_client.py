"""The GCS client's own aiohttp session (no gcsfs private methods)."""

from __future__ import annotations

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
