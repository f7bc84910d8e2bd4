"""The ``fsspec`` path type, on fsspec's real in-memory filesystem."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from ckpt_helpers import memory_keys, memory_root

from ckptstore import CorruptCheckpointError, FsspecPath
from ckptstore.errors import ObjectNotFoundError
from ckptstore.plugin._path_type import redact_url
from ckptstore.plugin._registry import Registry
from ckptstore.testing import imported_modules


def test_round_trip_of_parts_and_ranges() -> None:
    with memory_root() as url:
        storage = FsspecPath(url)
        array = np.arange(4, dtype=np.int64)
        storage.write_parts("a/b", [b"x", array])
        assert storage.read_bytes("a/b") == b"x" + array.tobytes()
        assert storage.read_bytes("a/b", 1, 8) == array[:1].tobytes()
        assert storage.read_bytes("a/b", 9) == array[1:].tobytes()
        assert storage.size("a/b") == 33
        assert storage.exists("a/b")
        head, tail = bytearray(1), np.zeros(4, dtype=np.int64)
        storage.read_into("a/b", 0, [memoryview(head), tail.data])
        assert bytes(head) == b"x"
        assert tail.tolist() == [0, 1, 2, 3]
        assert memory_keys(url) == ["a/b"]


def test_missing_and_short_objects() -> None:
    with memory_root() as url:
        storage = FsspecPath(url)
        with pytest.raises(ObjectNotFoundError) as info:
            storage.read_bytes("absent")
        assert info.value.key == "absent"
        assert storage.get_document("absent") is None
        assert not storage.exists("absent")
        storage.write_bytes("short", b"abc")
        with pytest.raises(CorruptCheckpointError, match="ends 1 bytes before"):
            storage.read_into("short", 0, [memoryview(bytearray(4))])


def test_delete_list_and_delete_tree() -> None:
    with memory_root() as url:
        storage = FsspecPath(url)
        for key in ("d/x", "d/sub/y", "e"):
            storage.write_bytes(key, b"1")
        assert storage.list_keys() == ["d/sub/y", "d/x", "e"]
        assert storage.list_keys("d/sub") == ["d/sub/y"]
        assert storage.list_keys("nothing") == []
        storage.delete(["e", "never-existed"])
        storage.delete_tree("d")
        storage.delete_tree("not-there")
        assert storage.list_keys() == []
        assert memory_keys(url) == []


def test_open_write_is_a_forward_only_stream() -> None:
    with memory_root() as url:
        storage = FsspecPath(url)
        stream = storage.open_write("deep/dir/stream")
        assert stream.writable()
        assert not stream.seekable()
        stream.write(b"abc")
        stream.write(b"de")
        assert stream.tell() == 5
        stream.close()
        stream.close()
        assert storage.read_bytes("deep/dir/stream") == b"abcde"


def test_capabilities_of_an_object_store() -> None:
    with memory_root() as url:
        storage = FsspecPath(url)
        assert not storage.supports_rename
        assert storage.copies_on_write
        assert storage.copies_on_read
        assert storage.accessible()
        assert storage.staging_keys("n.1") == []
        with pytest.raises(TypeError, match="cannot rename"):
            storage.replace_tree("a", "b")
        storage.put_document("_ckptstore/doc", b"{}")
        assert storage.get_document("_ckptstore/doc") == b"{}"


def test_urls_are_shown_without_credentials() -> None:
    assert redact_url("s3://key:secret@bucket/run?token=abc") == "s3://bucket/run"
    assert redact_url("memory://plain/run") == "memory://plain/run"
    with memory_root() as url:
        assert repr(FsspecPath(url)) == f"FsspecPath({url!r})"


def test_the_registry_serves_fsspec_urls(registry: Registry) -> None:
    with memory_root() as url:
        storage = registry.open_path(url)
        assert type(storage) is FsspecPath
        storage.write_bytes("k", b"v")
        assert memory_keys(url) == ["k"]


def test_local_disk_through_fsspec_refuses_links_out_of_the_root(tmp_path: Path) -> None:
    """docs/security.md: a resolved-path check on fsspec's local filesystem."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"secret")
    root = tmp_path / "root"
    root.mkdir()
    (root / "linked").symlink_to(outside)
    (root / "file").symlink_to(outside / "secret")
    storage = FsspecPath(f"file://{root}")
    for key in ("file", "linked/secret", "linked/new/doc"):
        with pytest.raises(CorruptCheckpointError, match="symbolic link"):
            storage.read_bytes(key)
    with pytest.raises(CorruptCheckpointError, match="symbolic link"):
        storage.write_bytes("linked/new/doc", b"x")
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]
    storage.write_bytes("real/doc", b"x")
    assert storage.read_bytes("real/doc") == b"x"


def test_a_local_disk_run_imports_no_fsspec_or_http_client(tmp_path: Path) -> None:
    """fsspec (0.08 s) and the object stores' HTTP clients (0.2-0.3 s each) are imported
    when a URL needs them: a process saving and loading on local disk, with every
    installed plugin registered, never pays for them."""
    probe = (
        "import numpy as np\n"
        "from ckptstore import CheckpointManager, LocalSession, get_registry\n"
        "assert get_registry().path_type_for('s3://b/p') is not None\n"
        "session = LocalSession()\n"
        "session.workspace('trainer_0')['w'] = np.ones(3)\n"
        f"manager = CheckpointManager({str(tmp_path / 'ckpt')!r}, 'trainer_0')\n"
        "session.run(manager.init(['trainer_0']))\n"
        "session.run(manager.save(1))\n"
        "session.run(manager.load(1))\n"
    )
    heavy = ["aiohttp", "botocore", "fsspec", "gcsfs", "s3fs"]
    assert imported_modules(probe, heavy) == []
    assert (tmp_path / "ckpt").is_dir()
