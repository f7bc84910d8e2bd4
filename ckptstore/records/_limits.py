"""Limits on what a stored document may declare, checked before anything is allocated.

A checkpoint read from storage is untrusted input (see docs/security.md): a forged
manifest could declare a shape of 10^12 elements, a chunk 2^64 bytes long or JSON nested
a million levels deep. Every such number is checked against these limits (and against
the real size of the stored files) before it is used; anything beyond them is a
:class:`~ckptstore.errors.CorruptCheckpointError`.

The defaults are far above what ckptstore writes but for two: a manifest of more than
64 MiB or of more than 4,000,000 JSON values (a node of about 360,000 small blobs,
whose parsed manifest takes ~600 MiB), which a save refuses to write rather than
write a checkpoint its loads would refuse. Raise them with :func:`set_limits`
or the ``CKPTSTORE_LIMIT_<FIELD>`` environment variables (read when the first document
is checked).

Example::

    >>> set_limits(replace(current_limits(), max_document_bytes=1 << 30))
    >>> current_limits().max_document_bytes
    1073741824
    >>> set_limits(None)  # back to the defaults (and the environment)
    >>> current_limits().max_document_bytes == Limits().with_environment().max_document_bytes
    True
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace

from ckptstore._environment import int_variable
from ckptstore.errors import JobConfigurationError

__all__ = ["Limits", "current_limits", "set_limits"]

GiB = 1 << 30


@dataclass(frozen=True)
class Limits:
    """Most that a stored document may declare.

    * ``max_document_bytes``: size of one JSON control document (manifest, commit
      record, catalog, format metadata).
    * ``max_json_depth``: nesting of ``[`` and ``{`` in one document.
    * ``max_json_values``: JSON values (objects, arrays, numbers, strings) one document
      may hold, counted on its bytes before parsing: what bounds the memory a parsed
      document takes (~100-160 bytes of Python objects per value; a manifest holds
      about 11 values per one-chunk blob).
    * ``max_ndim``: dimensions of one blob (numpy's own limit is 64).
    * ``max_blob_bytes``: bytes of one blob in memory.
    * ``max_chunk_bytes``: bytes one stored chunk may decode to.
    * ``max_file_bytes``: offsets and lengths inside one stored file.
    * ``max_chunks``: chunks and files listed in one manifest.
    * ``max_blobs``: blobs in one node checkpoint.
    * ``max_compression_ratio``: decoded bytes per stored byte of a compressed chunk
      (zstd cannot exceed about 32768: one byte per 128 KiB block, plus headers).
    """

    max_document_bytes: int = 64 << 20
    max_json_depth: int = 64
    max_json_values: int = 4_000_000
    max_ndim: int = 64
    max_blob_bytes: int = 1 << 44
    max_chunk_bytes: int = 4 * GiB
    max_file_bytes: int = 1 << 50
    max_chunks: int = 10_000_000
    max_blobs: int = 10_000_000
    max_compression_ratio: int = 1 << 17

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise JobConfigurationError(
                    f"{field.name} must be a positive integer, got {value!r}; pass one (or "
                    f"set {_environment_name(field.name)}), or leave it to the default"
                )

    def with_environment(self) -> Limits:
        """A copy with the ``CKPTSTORE_LIMIT_<FIELD>`` environment variables applied when
        set (an empty one is unset; one that is not a whole number is an
        :class:`~ckptstore.errors.EnvironmentVariableError` naming it)."""
        overrides = {}
        for field in fields(self):
            value = int_variable(os.environ, _environment_name(field.name))
            if value is not None:
                overrides[field.name] = value
        return replace(self, **overrides)


def _environment_name(field: str) -> str:
    """The environment variable that sets the limit ``field``."""
    return f"CKPTSTORE_LIMIT_{field.upper()}"


_current: Limits | None = None


def current_limits() -> Limits:
    """The limits in force (the defaults with the environment applied, unless set)."""
    global _current
    if _current is None:
        _current = Limits().with_environment()
    return _current


def set_limits(limits: Limits | None) -> None:
    """Use ``limits`` from now on (``None``: back to the defaults and environment)."""
    global _current
    _current = limits
