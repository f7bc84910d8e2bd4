"""ckptstore-s3: checkpoints in S3 buckets (AWS or any S3-compatible server).

Installing this distribution registers the ``s3`` path type, which serves ``s3://`` and
``s3a://`` URLs; see ``docs/object-stores.md``.

Example::

    from ckptstore import CheckpointManager
    manager = CheckpointManager("s3://bucket/run", "trainer_0", "npz",
                                storage_options={"region": "eu-west-1"})
"""

from ckptstore.object_store import RequestError, RetryPolicy
from ckptstore_s3.options import S3Options
from ckptstore_s3.path import S3Path

__all__ = ["RequestError", "RetryPolicy", "S3Options", "S3Path"]
__version__ = "0.1.0"
