"""ckptstore-lmdb: the ``lmdb`` DB type, for checkpoints of many small blobs on local disk.

Installing this distribution registers ``db_type="lmdb"`` through the ``ckptstore``
entry-point group.

Example::

    >>> from ckptstore import MultiNodeCheckpointManager
    >>> manager = MultiNodeCheckpointManager("ckpt", db_type="lmdb", metadata_handler="json")
"""

from ckptstore_lmdb.db import DATA_FILE, LmdbDB, lmdb_key
from ckptstore_lmdb.pages import LmdbFormatError, ValueSpan, value_spans

__all__ = ["DATA_FILE", "LmdbDB", "LmdbFormatError", "ValueSpan", "lmdb_key", "value_spans"]
