"""gcp-storage-emulator with crash-safe files: ``python -m ckptstore.testing.gcs_emulator``.

The emulator keeps its object index in one ``.meta`` JSON file that it rewrites in
place, so a server stopped while rewriting it restarts with an empty file and refuses
to start (``JSONDecodeError``). Real object stores never lose committed state when a
server stops, so this launcher makes every file the emulator writes appear whole or
not at all (written beside its target, then renamed over it) and then runs the
emulator's own command line unchanged.

From a shell: ``python -m ckptstore.testing.gcs_emulator -d /tmp/gcs start --port 9023``;
:class:`~ckptstore.testing.GcsEmulator` with a ``data_dir`` runs exactly that.

The emulator also ignores the ``ifGenerationMatch`` precondition of uploads, which is
what makes a GCS create once (``ifGenerationMatch=0``) or replace only the version it
read (``ifGenerationMatch=<generation>``). With ``--enforce-preconditions`` (first on
the command line; ``GcsEmulator(enforce_preconditions=True)``) the launcher makes it
answer 412 ``conditionNotMet``, as GCS does, when the object is not at the generation
asked for. The emulator serves one request at a time, so the check and the write are
one step: of racing conditional uploads exactly one wins.

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
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["enforce_preconditions", "main", "make_writes_atomic"]

ENFORCE_FLAG = "--enforce-preconditions"

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


_CONDITION_NOT_MET = {
    "error": {
        "code": 412,
        "message": "At least one of the pre-conditions you specified did not hold.",
        "errors": [
            {
                "domain": "global",
                "reason": "conditionNotMet",
                "message": "At least one of the pre-conditions you specified did not hold.",
                "locationType": "header",
                "location": "If-Match",
            }
        ],
    }
}


def enforce_preconditions() -> None:
    """Patch the emulator's object uploads to honour ``ifGenerationMatch`` (412
    ``conditionNotMet`` unless the object's generation is the one given; ``0``: the
    object must not exist), as GCS does."""
    from http import HTTPStatus

    from gcp_storage_emulator import server
    from gcp_storage_emulator.exceptions import NotFound
    from gcp_storage_emulator.handlers import objects

    original: Callable[..., object] = objects.insert

    def insert(request: Any, response: Any, storage: Any, *args: Any, **kwargs: Any) -> object:
        wanted = request.query.get("ifGenerationMatch")
        if wanted:
            names = request.query.get("name")  # a multipart upload names it in its metadata
            name = names[0] if names else request.data["meta"].get("name")
            try:
                current = str(
                    storage.get_file_obj(request.params["bucket_name"], name)["generation"]
                )
            except NotFound:
                current = "0"
            if current != wanted[0]:
                response.status = HTTPStatus.PRECONDITION_FAILED
                response.json(_CONDITION_NOT_MET)
                return None
        return original(request, response, storage, *args, **kwargs)

    objects.insert = insert  # the router's fallback for uploads looks it up here
    for _, handlers in server.HANDLERS:  # the routing table holds the function itself
        for method, handler in handlers.items():
            if handler is original:
                handlers[method] = insert


def main() -> None:
    """Patch the emulator, then run its command line (arguments as for
    ``gcp-storage-emulator``, after an optional ``--enforce-preconditions``)."""
    make_writes_atomic()
    if sys.argv[1:2] == [ENFORCE_FLAG]:
        del sys.argv[1]
        enforce_preconditions()
    from gcp_storage_emulator.__main__ import main as emulator_main

    emulator_main()


if __name__ == "__main__":
    main()
