"""gcp-storage-emulator with crash-safe files: ``python -m ckptstore.testing.gcs_emulator``.

The emulator keeps its object index in one ``.meta`` JSON file that it rewrites in
place, so a server stopped while rewriting it restarts with an empty file and refuses
to start (``JSONDecodeError``). Real object stores never lose committed state when a
server stops, so this launcher makes every file the emulator writes appear whole or
not at all (written beside its target, then renamed over it) and then runs the
emulator's own command line unchanged.

From a shell: ``python -m ckptstore.testing.gcs_emulator -d /tmp/gcs start --port 9023``;
:class:`~ckptstore.testing.GcsEmulator` with a ``data_dir`` runs exactly that.

Example::

    >>> from ckptstore.testing import GcsEmulator
    >>> server = GcsEmulator(data_dir="gcs-data")
    >>> server.command()[1:4]
    ['-m', 'ckptstore.testing.gcs_emulator', '-d']
    >>> server.data_dir == os.path.abspath("gcs-data")  # the emulator wants it absolute
    True
    >>> with server:
    ...     server.create_bucket("b")
    ...     upload = "/upload/storage/v1/b/b/o?uploadType=media&name=k"
    ...     status, _ = server.request("POST", upload, b"x")
    >>> with server:  # started again on the same files: the object is still there
    ...     print(server.object_keys("b"))
    ['k']
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from pathlib import Path

__all__ = ["main", "make_writes_atomic"]

_temporary_names = itertools.count()


def _write_whole(path: Path, content: bytes) -> None:
    """Write ``content`` to ``path`` so readers see the old or the new file, never part."""
    temporary = path.with_name(f".{path.name}.partial-{os.getpid()}-{next(_temporary_names)}")
    try:
        temporary.write_bytes(content)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def make_writes_atomic() -> None:
    """Patch the emulator's file store so each file it writes on disk is renamed into place."""
    from gcp_storage_emulator import storage

    file_store = getattr(storage, "_FileStore", None)
    if file_store is None or not hasattr(file_store, "_disk_path"):
        raise RuntimeError(
            "this gcp-storage-emulator has no storage._FileStore._disk_path to patch; "
            "install gcp-storage-emulator>=2026.7.19 (the ckptstore-gcs test extra)"
        )
    original: Callable[..., None] = file_store.write_bytes

    def write_bytes(self: object, rel: str, content: bytes) -> None:
        if getattr(self, "_use_memory", True):
            original(self, rel, content)
            return
        path: Path = self._disk_path(rel)  # type: ignore[attr-defined]
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_whole(path, content)

    file_store.write_bytes = write_bytes


def main() -> None:
    """Patch the emulator, then run its command line (arguments as for ``gcp-storage-emulator``)."""
    make_writes_atomic()
    from gcp_storage_emulator.__main__ import main as emulator_main

    emulator_main()


if __name__ == "__main__":
    main()
