"""Names of everything ckptstore puts under a checkpoint root, in one place.

::

    <root>/<node>.<epoch>/                 one node's checkpoint (a DB, in its format)
    <root>/<node>.<epoch>/ckptstore.manifest.json
                                           blobs, shapes, dtypes, a CRC-32C per chunk;
                                           written after the data
    <root>/_ckptstore/epoch-<N>.commit.json
                                           the epoch's commit record: the nodes whose
                                           save completed, with their manifests' CRC;
                                           written last
    <root>/.<node>.<epoch>.staging-<token>/  a save in progress (renaming storages)

Example::

    >>> commit_record_key(5)
    '_ckptstore/epoch-5.commit.json'
"""

from __future__ import annotations

import re

__all__ = [
    "CONTROL_DIR",
    "MANIFEST_NAME",
    "RETIRED_MARK",
    "STAGING_MARK",
    "commit_record_key",
    "manifest_key",
    "parse_db_key",
    "retired_key",
    "staging_key",
]

MANIFEST_NAME = "ckptstore.manifest.json"
CONTROL_DIR = "_ckptstore"
STAGING_MARK = ".staging-"
RETIRED_MARK = ".retired-"
_COMMIT_RECORD = re.compile(r"epoch-(\d+)\.commit\.json")
_DB_KEY = re.compile(r"(?P<node>[A-Za-z0-9_][A-Za-z0-9_:\-.]*)\.(?P<epoch>\d+)")


def commit_record_key(epoch: int) -> str:
    """Key of the commit record of ``epoch``."""
    return f"{CONTROL_DIR}/epoch-{epoch}.commit.json"


def parse_commit_record_key(key: str) -> int | None:
    """The epoch a commit record key belongs to, or ``None`` for another key."""
    prefix = CONTROL_DIR + "/"
    if not key.startswith(prefix):
        return None
    match = _COMMIT_RECORD.fullmatch(key[len(prefix) :])
    return int(match.group(1)) if match else None


def manifest_key(db_key: str) -> str:
    """Key of the manifest inside the node checkpoint ``db_key``."""
    return f"{db_key}/{MANIFEST_NAME}"


def staging_key(db_key: str, token: str) -> str:
    """Where a save of ``db_key`` is written before it is renamed into place."""
    return f".{db_key}{STAGING_MARK}{token}"


def retired_key(db_key: str, token: str) -> str:
    """Where an older ``db_key`` is moved while a new one replaces it."""
    return f".{db_key}{RETIRED_MARK}{token}"


def parse_db_key(name: str) -> tuple[str, int] | None:
    """``("trainer_0", 5)`` for ``"trainer_0.5"``; ``None`` for any other name."""
    match = _DB_KEY.fullmatch(name)
    return (match.group("node"), int(match.group("epoch"))) if match else None
