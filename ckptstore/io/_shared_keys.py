"""Keys of the shared chunk store: where an incremental save's large-blob chunks live,
once per content, for every node and epoch under a checkpoint root.

A manifest names such a chunk ``@chunks/<hash>`` (or ``@chunks/<hash>.<token>``,
a copy written while a collection ran: docs/design.md, "Incremental checkpoints"); every
key of a node checkpoint is relative to the node's directory, and this one alone
resolves to ``_ckptstore/chunks/<hash>`` beside it, under the checkpoint root. No
format writes such a key inside a node directory (archives have fixed names; compressed
zarr writes under blob names, and ``<hash>/...`` never matches the whole pattern).

Example::

    >>> resolve_key("trainer_0.3", "blobs.zarr.zip")
    'trainer_0.3/blobs.zarr.zip'
    >>> resolve_key("runs/a/trainer_0.3", shared_key("ab" * 16))
    'runs/a/_ckptstore/chunks/abababababababababababababababab'
    >>> resolve_key("trainer_0.3/attempt-0123456789ab", shared_key("ab" * 16))
    '_ckptstore/chunks/abababababababababababababababab'
"""

from __future__ import annotations

import re

__all__ = [
    "CHUNK_STORE_DIR",
    "SHARED_MARK",
    "chunk_object_key",
    "is_shared_key",
    "resolve_key",
    "shared_key",
]

SHARED_MARK = "@chunks/"
CHUNK_STORE_DIR = "_ckptstore/chunks"
_SHARED = re.compile(r"@chunks/[0-9a-f]{32}(?:\.[0-9a-f]{12})?")
_ATTEMPT_DIR = re.compile(r"(?P<node>.*)/attempt-[0-9a-f]{12}")
"""A save attempt's directory under its node checkpoint's (``records._layout``, which
this bottom layer cannot import, names it)."""


def shared_key(name: str) -> str:
    """The manifest key of the shared chunk ``name`` (``<hash>`` or ``<hash>.<token>``)."""
    key = f"{SHARED_MARK}{name}"
    if not _SHARED.fullmatch(key):
        raise ValueError(f"{name!r} is not a shared chunk's name")
    return key


def is_shared_key(key: str) -> bool:
    """Whether a manifest's chunk key names a chunk of the shared store."""
    return key.startswith(SHARED_MARK) and _SHARED.fullmatch(key) is not None


def chunk_object_key(key: str) -> str:
    """The key, relative to the checkpoint root, of the shared chunk ``key`` names."""
    return f"{CHUNK_STORE_DIR}/{key[len(SHARED_MARK) :]}"


def resolve_key(prefix: str, key: str) -> str:
    """The storage key of ``key``, relative to the node checkpoint ``prefix``: inside it,
    or, for a shared chunk, in the chunk store under the checkpoint root (``prefix``'s
    parent; ``prefix`` may be a save attempt's directory inside the node's)."""
    if key.startswith(SHARED_MARK) and _SHARED.fullmatch(key):
        attempt = _ATTEMPT_DIR.fullmatch(prefix)
        parent = (attempt.group("node") if attempt else prefix).rpartition("/")[0]
        stored = chunk_object_key(key)
        return f"{parent}/{stored}" if parent else stored
    return f"{prefix}/{key}" if prefix else key
