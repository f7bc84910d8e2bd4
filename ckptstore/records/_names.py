"""Checkpoint naming: Caffe2's ``db_name`` helpers and the rules that keep every name
inside its checkpoint prefix.

Example::

    >>> db_name(5, "trainer_0", "/tmp/x")
    '/tmp/x/trainer_0.5'
    >>> validate_blob_name("trainer_1/total")
    'trainer_1/total'
"""

from __future__ import annotations

import numbers
import os
import posixpath
import re

from ckptstore.errors import InvalidEpochError, InvalidNameError

__all__ = [
    "db_name",
    "get_ckpt_filename",
    "join_url",
    "validate_blob_name",
    "validate_epoch",
    "validate_key",
    "validate_node_name",
]

_NODE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_:\-.]{0,199}")
_MAX_BLOB_NAME = 1024
MAX_SEGMENT_BYTES = 255
"""Longest ``/``-separated segment of a new blob name, in UTF-8 bytes: the limit of a
path component on common local file systems (ext4, XFS, APFS, NTFS), which formats
storing a blob as files (zarr) would otherwise hit in the middle of a save."""
_FORBIDDEN_CHARS = re.compile(r"[\x00-\x1f\x7f\\]")


MAX_EPOCH = (1 << 63) - 1
"""The largest epoch: commit records and manifests hold an epoch as a signed 64-bit
integer, and a reader refuses a larger one as forged."""


def validate_epoch(epoch: object, argument: str = "epoch") -> int:
    """``epoch`` as an ``int`` if it is an epoch (a non-negative integer up to
    :data:`MAX_EPOCH`: an ``int`` or any :class:`numbers.Integral`, such as a numpy
    integer), else raise :class:`~ckptstore.errors.InvalidEpochError` naming
    ``argument``. Bools, floats (even ``4.0``) and strings (even ``"1"``) are refused:
    an epoch becomes a file name (``trainer_0.4``), and only one spelling may name it.
    """
    if type(epoch) is int and 0 <= epoch <= MAX_EPOCH:
        return epoch  # the common case, at once
    if isinstance(epoch, bool) or not isinstance(epoch, numbers.Integral):
        raise InvalidEpochError(argument, epoch, f"it is a {type(epoch).__name__}")
    value = int(epoch)
    if value < 0:
        raise InvalidEpochError(argument, epoch, "it is negative")
    if value > MAX_EPOCH:
        raise InvalidEpochError(argument, epoch, "it does not fit a signed 64-bit integer")
    return value


def get_ckpt_filename(node_name: str, epoch: int) -> str:
    """The name of one node's checkpoint of one epoch, such as ``"trainer_0.5"``.

    Every checkpoint name is formed here, so no API can write ``trainer_0.True``: an
    ``epoch`` that is not one raises :class:`~ckptstore.errors.InvalidEpochError`."""
    return f"{node_name}.{validate_epoch(epoch)}"


def join_url(prefix: str, name: str) -> str:
    """Join a local path or URL prefix and a relative name with exactly one ``/``."""
    if "://" in prefix:
        scheme, _, path = prefix.partition("://")
        # a root with no path ("memory://", "file:///") keeps its slashes
        return f"{scheme}://{path.rstrip('/')}/{name}" if path.rstrip("/") else prefix + name
    return posixpath.join(prefix, name)


def db_name(epoch: int, node_name: str, db_prefix: str, path_prefix: str | None = None) -> str:
    """Where a node's checkpoint for ``epoch`` lives, exactly as Caffe2 computes it.

    With a non-empty ``path_prefix`` the result is plain concatenation (no separator);
    otherwise it is ``db_prefix`` joined with ``get_ckpt_filename(node_name, epoch)``.
    """
    if path_prefix:
        return path_prefix + get_ckpt_filename(node_name, epoch)
    return join_url(db_prefix, get_ckpt_filename(node_name, epoch))


def validate_node_name(name: object) -> str:
    """Return ``name`` if it is a safe node name, else raise :class:`InvalidNameError`.

    Node names become file and object names, so they are limited to letters, digits and
    ``_ : - .``, may not start with ``.`` (hidden and staging names) and hold no ``/``.
    """
    if not isinstance(name, str):
        raise InvalidNameError("node name", name, "node names are strings")
    if not _NODE_NAME.fullmatch(name):
        raise InvalidNameError(
            "node name",
            name,
            "use 1-200 letters, digits or '_:-.', not starting with '.' or '-'",
        )
    return name


_WINDOWS_RESERVED = re.compile(r"(?i)(CON|PRN|AUX|NUL|COM[0-9]|LPT[0-9])(\..*)?|.*[. ]")


def _check_segments(what: str, name: str) -> None:
    if name.startswith("/"):
        raise InvalidNameError(what, name, "it must be relative, without a leading '/'")
    for segment in name.split("/"):
        if segment in ("", ".", ".."):
            raise InvalidNameError(
                what, name, "empty, '.' and '..' path segments could escape the prefix"
            )
        if os.name == "nt" and (_WINDOWS_RESERVED.fullmatch(segment) or ":" in segment):
            raise InvalidNameError(
                what, name, f"{segment!r} is a reserved file name on this platform"
            )


def validate_blob_name(name: object, *, new: bool = True) -> str:
    """Return ``name`` if it is a safe blob name, else raise :class:`InvalidNameError`.

    Blob names may use ``/`` to form a hierarchy (``"trainer_1/total"``); no segment
    may be empty, ``.`` or ``..``, and control characters and backslashes are refused.
    A ``new`` name (one about to be stored) also keeps every segment within
    :data:`MAX_SEGMENT_BYTES`, on every format, so that any checkpoint converts to any
    format; names read from existing manifests are checked with ``new=False``.
    """
    if type(name) is str and (name in _VALID_NEW or (not new and name in _VALID_OLD)):
        return name  # a name valid as new is valid as old too
    checked = _check_blob_name(name, new=new)
    if len(_VALID_NEW) + len(_VALID_OLD) < _REMEMBER_NAMES:
        # a name no longer than a segment may be is valid as new too (checked once)
        short = len(checked) * 4 <= MAX_SEGMENT_BYTES or (
            len(checked.encode("utf-8", "surrogatepass")) <= MAX_SEGMENT_BYTES
        )
        (_VALID_NEW if new or short else _VALID_OLD).add(checked)
    return checked


_VALID_NEW: set[str] = set()
"""Names already found valid as new names (and so as old ones): a save and a load check
each name several times, thousands of names per checkpoint. Plain strings, which the
cyclic garbage collector does not track: remembering 10,000 names adds nothing for it to
walk (a tuple each did, and set off full collections while a workspace filled up)."""
_VALID_OLD: set[str] = set()
"""Names found valid only as names read from existing manifests (``new=False``)."""
_REMEMBER_NAMES = 1 << 17


def _check_blob_name(name: object, *, new: bool) -> str:
    if not isinstance(name, str):
        raise InvalidNameError("blob name", name, "blob names are strings")
    if not name or len(name) > _MAX_BLOB_NAME:
        raise InvalidNameError("blob name", name, f"use 1-{_MAX_BLOB_NAME} characters")
    if _FORBIDDEN_CHARS.search(name):
        raise InvalidNameError("blob name", name, "control characters and '\\' are not allowed")
    _check_segments("blob name", name)
    if new:
        for segment in name.split("/"):
            size = len(segment.encode("utf-8", "surrogatepass"))
            if size > MAX_SEGMENT_BYTES:
                raise InvalidNameError(
                    "blob name",
                    name,
                    f"its segment {segment[:40]!r}... is {size} bytes in UTF-8, more than the "
                    f"{MAX_SEGMENT_BYTES} a path component may hold on local disk; shorten it "
                    "or split it with '/'",
                )
    return name


def validate_key(key: object) -> str:
    """Return ``key`` if it is a safe storage key relative to a checkpoint root."""
    if not isinstance(key, str) or not key:
        raise InvalidNameError("storage key", key, "keys are non-empty strings")
    if _FORBIDDEN_CHARS.search(key):
        raise InvalidNameError("storage key", key, "control characters and '\\' are not allowed")
    _check_segments("storage key", key)
    return key
