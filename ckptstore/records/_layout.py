"""Names of everything ckptstore puts under a checkpoint root, in one place.

::

    <root>/<node>.<epoch>/attempt-<id>/    one save attempt of a node's checkpoint (a DB,
                                           in its format); <id> is 12 random hex digits,
                                           so no two attempts share a name
    <root>/<node>.<epoch>/attempt-<id>/ckptstore.manifest.json
                                           blobs, shapes, dtypes, a CRC-32 per chunk;
                                           written after the data
    <root>/_ckptstore/epoch-<N>/<node>.commit.json
                                           one node's commit record for epoch N: the
                                           attempt it commits and that attempt's
                                           manifest's CRC; created once (never
                                           replaced), written last. The epoch's record
                                           is the union of its nodes' records
    <root>/<node>.<epoch>/ckptstore.manifest.json
                                           a node's checkpoint as earlier versions wrote
                                           it (no attempt directory; its record names no
                                           attempt): still read
    <root>/_ckptstore/epoch-<N>.commit.json
                                           the one-document commit record of earlier
                                           versions (still read, never written)
    <root>/_ckptstore/lease/<node>.json    the writer lease of the job writing <node>
    <root>/.<node>.<epoch>.staging-<token>/  a save in progress of an earlier version

An attempt is written once and never renamed: the commit record alone decides which
attempt of a (node, epoch) is its checkpoint. Attempts no record names are garbage
once another attempt of their (node, epoch) is committed (``ckptstore gc``).

Example::

    >>> node_commit_key(5, "trainer_0")
    '_ckptstore/epoch-5/trainer_0.commit.json'
    >>> node_data_key("trainer_0", 5, "0123456789ab")
    'trainer_0.5/attempt-0123456789ab'
"""

from __future__ import annotations

import re
import secrets

from ckptstore.records._names import get_ckpt_filename, validate_epoch

__all__ = [
    "ATTEMPT_MARK",
    "CONTROL_DIR",
    "MANIFEST_NAME",
    "RETIRED_MARK",
    "STAGING_MARK",
    "commit_record_key",
    "epoch_commit_dir",
    "lease_key",
    "manifest_key",
    "new_attempt",
    "node_commit_key",
    "node_data_key",
    "parse_attempt_dir",
    "parse_commit_record_key",
    "parse_db_key",
    "parse_node_commit_key",
    "retired_key",
    "staging_key",
    "validate_attempt",
]

MANIFEST_NAME = "ckptstore.manifest.json"
CONTROL_DIR = "_ckptstore"
STAGING_MARK = ".staging-"
RETIRED_MARK = ".retired-"
ATTEMPT_MARK = "attempt-"
_ATTEMPT = re.compile(r"[0-9a-f]{12}")
_COMMIT_RECORD = re.compile(r"epoch-(\d+)\.commit\.json")
_NODE_COMMIT_RECORD = re.compile(r"epoch-(\d+)/([A-Za-z0-9_][A-Za-z0-9_:\-.]*)\.commit\.json")
LEASE_DIR = f"{CONTROL_DIR}/lease"
_DB_KEY = re.compile(r"(?P<node>[A-Za-z0-9_][A-Za-z0-9_:\-.]*)\.(?P<epoch>\d+)")


def commit_record_key(epoch: int) -> str:
    """Key of the one-document commit record of ``epoch`` that earlier versions wrote
    (read for compatibility; new commits are per node: :func:`node_commit_key`)."""
    return f"{CONTROL_DIR}/epoch-{validate_epoch(epoch)}.commit.json"


def epoch_commit_dir(epoch: int) -> str:
    """The prefix holding ``epoch``'s per-node commit records (an ``epoch`` that is not
    one raises :class:`~ckptstore.errors.InvalidEpochError`)."""
    return f"{CONTROL_DIR}/epoch-{validate_epoch(epoch)}"


def node_commit_key(epoch: int, node: str) -> str:
    """Key of ``node``'s commit record for ``epoch`` (created once, never replaced)."""
    return f"{epoch_commit_dir(epoch)}/{node}.commit.json"


def lease_key(node: str) -> str:
    """Key of the writer lease of ``node`` under a checkpoint root."""
    return f"{LEASE_DIR}/{node}.json"


def parse_node_commit_key(key: str) -> tuple[int, str] | None:
    """``(epoch, node)`` of a per-node commit record key, ``None`` for another key."""
    prefix = CONTROL_DIR + "/"
    if not key.startswith(prefix):
        return None
    match = _NODE_COMMIT_RECORD.fullmatch(key[len(prefix) :])
    return (int(match.group(1)), match.group(2)) if match else None


def parse_commit_record_key(key: str) -> int | None:
    """The epoch a commit record key (per node, or an earlier version's one-document
    record) belongs to, or ``None`` for another key."""
    prefix = CONTROL_DIR + "/"
    if not key.startswith(prefix):
        return None
    match = _COMMIT_RECORD.fullmatch(key[len(prefix) :])
    if match:
        return int(match.group(1))
    per_node = parse_node_commit_key(key)
    return per_node[0] if per_node else None


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


def new_attempt() -> str:
    """A fresh attempt id (12 random hex digits): the name of one save's data."""
    return secrets.token_hex(6)


def validate_attempt(attempt: str) -> str:
    """``attempt`` if it is an attempt id (12 lowercase hex digits); ValueError if not
    (a stored id is untrusted: it becomes part of a key)."""
    if not isinstance(attempt, str) or not _ATTEMPT.fullmatch(attempt):
        raise ValueError("an attempt id is not 12 lowercase hex digits")
    return attempt


def node_data_key(node: str, epoch: int, attempt: str | None) -> str:
    """The key prefix of ``node``'s checkpoint of ``epoch`` written by ``attempt``
    (``None``: a checkpoint of an earlier version, written at ``<node>.<epoch>``)."""
    db_key = get_ckpt_filename(node, epoch)
    return db_key if attempt is None else f"{db_key}/{ATTEMPT_MARK}{validate_attempt(attempt)}"


def parse_attempt_dir(name: str) -> str | None:
    """The attempt id of an attempt directory's name (``attempt-<id>``), else ``None``."""
    if not name.startswith(ATTEMPT_MARK):
        return None
    attempt = name[len(ATTEMPT_MARK) :]
    return attempt if _ATTEMPT.fullmatch(attempt) else None
