"""Stored pieces checked against the real stored files before anything is allocated,
and whatever a format raises on forged bytes turned into one typed error.

A manifest is untrusted (see docs/security.md): its offsets and lengths must fall
inside files that exist, so a forged "10^12 elements" or "2^64 offset" is refused
after one ``size`` call per file, not after allocating terabytes.

Example::

    >>> from ckptstore.builtin import LocalPath
    >>> storage = LocalPath("bounds")
    >>> storage.write_parts("trainer_0.3/blobs.bin", [b"hello"])
    >>> forged = ChunkRecord("blobs.bin", offset=0, stored=1 << 40, size=1 << 40, crc=0)
    >>> check_pieces_fit(storage, "trainer_0.3", [forged])  # refused before allocating 1 TiB
    Traceback (most recent call last):
    ckptstore.errors.CorruptCheckpointError: ...the file holds 5...
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

from ckptstore.errors import (
    CkptStoreError,
    CorruptCheckpointError,
    MissingDependencyError,
    ObjectNotFoundError,
    UnsupportedBlobError,
)
from ckptstore.io import is_shared_key
from ckptstore.plugin import DBType, PathType
from ckptstore.records import BlobRecord, ChunkRecord

__all__ = ["UNCHECKED_BYTES", "check_decodable", "check_pieces_fit", "corrupt_in_node"]

UNCHECKED_BYTES = 64 << 20
"""Pieces totalling at most this many bytes are not size-checked before they are read:
the buffers are harmless, and a short file is reported by the read itself."""


def check_pieces_fit(
    storage: PathType, root: str, pieces: Iterable[ChunkRecord], *, missing_ok: bool = False
) -> None:
    """Raise :class:`CorruptCheckpointError` unless every piece (``offset + stored``)
    lies inside its stored file under ``root``; one ``size`` call per distinct file.
    With ``missing_ok``, pieces of missing files are left for the reader to report."""
    ends: dict[str, int] = {}
    total = 0
    for piece in pieces:
        if is_shared_key(piece.key):
            continue  # one object per chunk: a short one is reported when it is read
        total += piece.stored
        end = piece.offset + piece.stored
        if end > ends.get(piece.key, -1):
            ends[piece.key] = end
    if total <= UNCHECKED_BYTES:
        # a size request per file costs a round trip (a stat, a HEAD); buffers this
        # small are harmless, and a short file is still reported when it is read
        return
    for relative, end in ends.items():
        key = f"{root}/{relative}"
        try:
            size = storage.size(key)
        except ObjectNotFoundError:
            if missing_ok:
                continue
            raise CorruptCheckpointError(
                "the file is missing", url=storage.display_url, file=key
            ) from None
        if end > size:
            raise CorruptCheckpointError(
                f"the manifest records bytes up to offset {end}, the file holds {size}",
                url=storage.display_url,
                file=key,
            )


def check_decodable(storage: PathType, records: Iterable[BlobRecord], db_type: DBType) -> None:
    """Raise :class:`CorruptCheckpointError` unless ``db_type`` decodes every record's
    codec (:attr:`~ckptstore.plugin.DBType.codecs`) and its dtype is one this ckptstore
    builds: what a load would stop at, found before anything is read. A dtype needing
    an optional package that is not installed (ml_dtypes) passes: the checkpoint is
    intact, and a load raises :class:`~ckptstore.errors.MissingDependencyError` itself
    (verifying and copying do not need the package)."""
    for record in records:
        if record.codec not in db_type.codecs:
            raise CorruptCheckpointError(
                f"codec {record.codec!r} is none that the {db_type.name} format decodes "
                f"({sorted(db_type.codecs)})",
                url=storage.display_url,
                blob=record.name,
            )
        with contextlib.suppress(MissingDependencyError):
            record.numpy_dtype()  # UnsupportedBlobError: corrupt in corrupt_in_node


@contextlib.contextmanager
def corrupt_in_node(storage: PathType, node: str, epoch: int) -> Iterator[None]:
    """Name ``node`` and ``epoch`` in every :class:`CorruptCheckpointError` raised
    inside, and turn what a format raises while decoding stored bytes (anything but
    ckptstore's own and storage errors) into one. So is an
    :class:`~ckptstore.errors.UnsupportedBlobError` (a codec or dtype a stored manifest
    names that no reader here decodes: forged, or written by something else), so a
    resume falls back past it; a :class:`~ckptstore.errors.MissingDependencyError` (an
    intact checkpoint needing an optional package) is raised as it is."""
    try:
        yield
    except CorruptCheckpointError as error:
        raise error.located(node=node, epoch=epoch) from None
    except MissingDependencyError:
        raise
    except UnsupportedBlobError as error:
        raise CorruptCheckpointError(
            f"the manifest records what no reader here decodes: {error.reason}",
            url=storage.display_url,
            blob=error.blob,
            node=node,
            epoch=epoch,
        ) from None
    except (CkptStoreError, OSError):
        raise
    except MemoryError:
        # numpy refuses an impossible np.empty at once, before touching memory
        raise CorruptCheckpointError(
            "the checkpoint declares more bytes than this machine can allocate (if it is "
            "genuine, load it where more memory is available)",
            url=storage.display_url,
            node=node,
            epoch=epoch,
        ) from None
    except Exception as error:
        raise CorruptCheckpointError(
            f"the stored bytes cannot be decoded ({type(error).__name__})",
            url=storage.display_url,
            node=node,
            epoch=epoch,
        ) from error
