"""The S3 client's session handling, through s3fs's public ``set_session`` only."""

from __future__ import annotations

from ckptstore_s3 import S3Path


def test_a_closed_path_opens_a_new_session_when_used_again(s3_url: str) -> None:
    storage = S3Path(s3_url)
    storage.write_bytes("a", b"first")
    storage.close()
    storage.close()  # closing twice is harmless
    storage.write_bytes("b", b"second")
    assert storage.read_bytes("a") == b"first"
    assert storage.read_bytes("b") == b"second"
    storage.close()
