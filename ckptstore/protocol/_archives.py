"""Packed archives checked for third-party readers: what ``ckptstore verify --deep``
reports, and what ``ckptstore cp`` and ``convert`` refuse to copy or rewrite.

ckptstore never reads a node's ZIP structure (the manifest says where every byte is),
but docs/reading-without-ckptstore.md sends people to open ``blobs.zarr.zip`` and
``blobs.npz`` with zarr, numpy or ``zipfile``. A forged central directory (member names
with ``..``, sizes of 2^63, a member inflating to gigabytes) passes every checksum, as
the attacker recomputes them; :func:`check_archives` parses the structure itself
(:func:`ckptstore.io._zip_check.check_archive`) within the current
:class:`~ckptstore.records.Limits`.

Example::

    >>> from ckptstore import CheckpointManager, LocalSession
    >>> from ckptstore.builtin import LocalPath
    >>> session = LocalSession()
    >>> session.workspace("trainer_0")["w"] = np.ones(2)
    >>> manager = CheckpointManager("archived", "trainer_0", "zarr")
    >>> _ = session.run(manager.init(["trainer_0"]))
    >>> _ = session.run(manager.save(1))
    >>> from ckptstore.protocol import open_node
    >>> storage = LocalPath("archived")
    >>> check_archives(storage, open_node(storage, "trainer_0", 1))
    []
"""

from __future__ import annotations

from functools import partial

from ckptstore.errors import CorruptCheckpointError, ObjectNotFoundError
from ckptstore.io import ArchiveBounds, UnsafeArchiveError, check_archive
from ckptstore.plugin import PathType
from ckptstore.protocol._commit import open_node
from ckptstore.protocol._location import CheckpointLocation, storage_of
from ckptstore.records import NodeManifest, current_limits

__all__ = ["ARCHIVE_SUFFIXES", "check_archives", "refuse_unsafe_archives"]

ARCHIVE_SUFFIXES = (".zip", ".npz")
"""Files of a node checkpoint that are ZIP archives (zarr's ``blobs.zarr.zip``, npz's
``blobs.npz``, and their numbered siblings)."""


def check_archives(
    where: CheckpointLocation | PathType, manifest: NodeManifest
) -> list[CorruptCheckpointError]:
    """One error per archive of ``manifest``'s node checkpoint that a ZIP reader could
    not open safely (see :func:`~ckptstore.io._zip_check.check_archive`); empty if none."""
    storage = storage_of(where)
    limits = current_limits()
    bounds = ArchiveBounds(
        max_members=limits.max_chunks,
        max_inflated=limits.max_document_bytes,
        max_ratio=limits.max_compression_ratio,
    )
    root = manifest.data_key
    keys = {chunk.key for record in manifest.blobs.values() for chunk in record.chunks}
    keys.update(chunk.key for chunk in manifest.files)
    problems = []
    for relative in sorted(key for key in keys if key.endswith(ARCHIVE_SUFFIXES)):
        key = f"{root}/{relative}"
        try:
            size = storage.size(key)
            check_archive(partial(storage.read_bytes, key), size, bounds)
        except ObjectNotFoundError:
            detail = "the archive is missing"
        except UnsafeArchiveError as error:
            detail = f"not a ZIP archive other readers may open safely: {error}"
        except CorruptCheckpointError as error:
            problems.append(error.located(node=manifest.node, epoch=manifest.epoch))
            continue
        else:
            continue
        problems.append(
            CorruptCheckpointError(
                detail,
                url=storage.display_url,
                file=key,
                node=manifest.node,
                epoch=manifest.epoch,
            )
        )
    return problems


def refuse_unsafe_archives(storage: PathType, node: str, epoch: int) -> None:
    """Raise the first problem :func:`check_archives` finds in ``node``'s committed
    checkpoint of ``epoch`` (``cp`` and ``convert`` refuse what ``verify --deep``
    reports)."""
    problems = check_archives(storage, open_node(storage, node, epoch))
    if problems:
        raise problems[0]
