"""The ``fsspec`` path type, on fsspec's real in-memory filesystem."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from ckpt_helpers import http_server, memory_keys, memory_root

from ckptstore import CorruptCheckpointError
from ckptstore.builtin import FsspecPath
from ckptstore.errors import ObjectNotFoundError, RequestError, StorageError, is_permanent
from ckptstore.plugin._path_type import redact_url
from ckptstore.plugin._registry import Registry
from ckptstore.protocol import committed_epochs
from ckptstore.testing import imported_modules
from ckptstore.testing.servers import free_port


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
        "from ckptstore import CheckpointManager, LocalSession\n"
        "from ckptstore.plugin import get_registry\n"
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


def test_an_http_store_lists_checks_and_reads_what_it_serves(tmp_path: Path) -> None:
    (tmp_path / "run" / "_ckptstore" / "sub").mkdir(parents=True)
    (tmp_path / "run" / "_ckptstore" / "a.json").write_bytes(b"{}")
    (tmp_path / "run" / "_ckptstore" / "sub" / "b").write_bytes(b"bytes")
    with http_server(tmp_path) as url:
        storage = FsspecPath(f"{url}/run")
        assert storage.list_keys() == ["_ckptstore/a.json", "_ckptstore/sub/b"]
        assert storage.list_keys("nothing") == []
        assert storage.exists("_ckptstore/sub/b")
        assert not storage.exists("_ckptstore/nothing")
        assert storage.size("_ckptstore/sub/b") == 5
        assert storage.read_bytes("_ckptstore/sub/b") == b"bytes"
        # the standard library's server ignores Range: sent the whole file, refused
        with pytest.raises(StorageError, match="it ignores byte ranges") as info:
            storage.read_bytes("_ckptstore/sub/b", 1, 3)
        assert "the storage sent 5 bytes" in str(info.value)
        assert storage.get_document("_ckptstore/nothing") is None
        with pytest.raises(ObjectNotFoundError):
            storage.size("_ckptstore/nothing")


def lookups(storage: FsspecPath) -> list[Callable[[], object]]:
    """Every way of asking the storage what it holds, each of which fsspec alone can
    answer with "nothing" when the asking failed."""
    return [
        storage.list_keys,
        lambda: storage.exists("_ckptstore/a.json"),
        lambda: storage.size("_ckptstore/a.json"),
        lambda: storage.read_bytes("_ckptstore/a.json"),
        lambda: storage.get_document("_ckptstore/a.json"),
        lambda: committed_epochs(storage),  # what a resume lists: never "no epochs yet"
    ]


def test_an_http_store_that_cannot_be_reached_is_an_error_not_an_empty_store() -> None:
    # fsspec answers "no such file" or an empty listing for a refused connection
    storage = FsspecPath(f"http://127.0.0.1:{free_port()}/run")
    for call in lookups(storage):
        with pytest.raises(StorageError, match="ECONNREFUSED") as info:
            call()
        assert not isinstance(info.value, FileNotFoundError)
        assert storage.display_url in str(info.value)
        assert not is_permanent(info.value)  # a save would retry it


@pytest.mark.parametrize(("status", "permanent"), [(503, False), (500, False), (403, True)])
def test_http_errors_are_storage_errors_typed_by_their_status(status: int, permanent: bool) -> None:
    with http_server(status=status) as url:
        storage = FsspecPath(f"{url}/run")
        for call in lookups(storage):
            with pytest.raises(StorageError, match=f"HTTP {status}") as info:
                call()
            assert isinstance(info.value.__cause__, RequestError)
            assert info.value.__cause__.status == status
            assert is_permanent(info.value) is permanent
