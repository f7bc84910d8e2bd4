"""What ckptstore stores, as values: names and storage keys, the layout of a checkpoint
root, node manifests, self-checking control documents, and operation stats.

Owns the on-storage vocabulary (no I/O). May import only :mod:`ckptstore.io` (checksums),
:mod:`ckptstore.errors` and the standard library.

Example::

    >>> from ckptstore.records import commit_record_key, db_name
    >>> commit_record_key(5)
    '_ckptstore/epoch-5.commit.json'
    >>> db_name(3, "trainer_0", "/ckpt")
    '/ckpt/trainer_0.3'
"""

from ckptstore.records._documents import (
    decode_document,
    encode_document,
    json_int,
    json_list,
    json_object,
)
from ckptstore.records._layout import (
    CONTROL_DIR,
    MANIFEST_NAME,
    RETIRED_MARK,
    STAGING_MARK,
    commit_record_key,
    manifest_key,
    parse_db_key,
    retired_key,
    staging_key,
)
from ckptstore.records._manifest import BlobRecord, ChunkRecord, NodeManifest, safe_dtype
from ckptstore.records._names import (
    db_name,
    get_ckpt_filename,
    join_url,
    validate_blob_name,
    validate_key,
    validate_node_name,
)
from ckptstore.records._stats import ACTIONS, NodeStats

__all__ = [
    "ACTIONS",
    "CONTROL_DIR",
    "MANIFEST_NAME",
    "RETIRED_MARK",
    "STAGING_MARK",
    "BlobRecord",
    "ChunkRecord",
    "NodeManifest",
    "NodeStats",
    "commit_record_key",
    "db_name",
    "decode_document",
    "encode_document",
    "get_ckpt_filename",
    "join_url",
    "json_int",
    "json_list",
    "json_object",
    "manifest_key",
    "parse_db_key",
    "retired_key",
    "safe_dtype",
    "staging_key",
    "validate_blob_name",
    "validate_key",
    "validate_node_name",
]
