"""What ckptstore stores, as values: names and storage keys, the layout of a checkpoint
root, node manifests, self-checking control documents, and operation stats.

Owns the on-storage vocabulary (no I/O). May import only :mod:`ckptstore.io` (checksums),
:mod:`ckptstore.errors` and the standard library.

Example::

    >>> from ckptstore.records import db_name, node_commit_key
    >>> node_commit_key(5, "trainer_0")
    '_ckptstore/epoch-5/trainer_0.commit.json'
    >>> db_name(3, "trainer_0", "/ckpt")
    '/ckpt/trainer_0.3'
"""

from ckptstore.records._commit_record import NODE_COMMIT_KIND, NodeCommit, stored_int
from ckptstore.records._documents import (
    decode_document,
    encode_document,
    json_int,
    json_list,
    json_number,
    json_object,
)
from ckptstore.records._dtypes import (
    ML_DTYPES_INSTALL,
    check_value,
    decode_dtype,
    encode_dtype,
    plain_dtype,
)
from ckptstore.records._layout import (
    ATTEMPT_MARK,
    CONTROL_DIR,
    LEASE_DIR,
    MANIFEST_NAME,
    RETIRED_MARK,
    STAGING_MARK,
    commit_record_key,
    epoch_commit_dir,
    lease_key,
    manifest_key,
    new_attempt,
    node_commit_key,
    node_data_key,
    parse_attempt_dir,
    parse_commit_record_key,
    parse_db_key,
    parse_node_commit_key,
    retired_key,
    staging_key,
)
from ckptstore.records._limits import Limits, current_limits, set_limits
from ckptstore.records._manifest import BlobRecord, ChunkRecord, NodeManifest, safe_dtype
from ckptstore.records._names import (
    db_name,
    get_ckpt_filename,
    join_url,
    validate_blob_name,
    validate_epoch,
    validate_key,
    validate_node_name,
)
from ckptstore.records._stats import ACTIONS, NodeStats

__all__ = [
    "ACTIONS",
    "ATTEMPT_MARK",
    "CONTROL_DIR",
    "LEASE_DIR",
    "MANIFEST_NAME",
    "ML_DTYPES_INSTALL",
    "NODE_COMMIT_KIND",
    "RETIRED_MARK",
    "STAGING_MARK",
    "BlobRecord",
    "ChunkRecord",
    "Limits",
    "NodeCommit",
    "NodeManifest",
    "NodeStats",
    "check_value",
    "commit_record_key",
    "current_limits",
    "db_name",
    "decode_document",
    "decode_dtype",
    "encode_document",
    "encode_dtype",
    "epoch_commit_dir",
    "get_ckpt_filename",
    "join_url",
    "json_int",
    "json_list",
    "json_number",
    "json_object",
    "lease_key",
    "manifest_key",
    "new_attempt",
    "node_commit_key",
    "node_data_key",
    "parse_attempt_dir",
    "parse_commit_record_key",
    "parse_db_key",
    "parse_node_commit_key",
    "plain_dtype",
    "retired_key",
    "safe_dtype",
    "set_limits",
    "staging_key",
    "stored_int",
    "validate_blob_name",
    "validate_epoch",
    "validate_key",
    "validate_node_name",
]
