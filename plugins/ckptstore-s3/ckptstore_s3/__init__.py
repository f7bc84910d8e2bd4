"""ckptstore-s3: checkpoints in S3 buckets (AWS or any S3-compatible server).

Installing this distribution registers the ``s3`` path type, which serves ``s3://`` and
``s3a://`` URLs; see ``docs/object-stores.md``. Settings come from the AWS environment
or ``storage_options`` (e.g. ``{"region": "eu-west-1"}``); the example runs against a
local moto server.

Example::

    >>> options = s3_options("quickstart")  # endpoint and keys of a fresh bucket
    >>> from ckptstore import CheckpointManager, LocalSession
    >>> session = LocalSession()
    >>> session.workspace("trainer_0")["w"] = np.ones(2)
    >>> manager = CheckpointManager("s3://quickstart/run", "trainer_0", "npz",
    ...                             storage_options=options)
    >>> _ = session.run(manager.init(["trainer_0"]))
    >>> _ = session.run(manager.save(1))
    >>> import re
    >>> for key in manager.location.storage.list_keys():
    ...     print(re.sub("attempt-[0-9a-f]{12}", "attempt-<id>", key))
    _ckptstore/epoch-1/trainer_0.commit.json
    trainer_0.1/attempt-<id>/blobs.npz
    trainer_0.1/attempt-<id>/ckptstore.manifest.json
"""

from ckptstore.object_store import RequestError, RetryPolicy
from ckptstore_s3.options import S3Options
from ckptstore_s3.path import S3Path

__all__ = ["RequestError", "RetryPolicy", "S3Options", "S3Path"]
__version__ = "0.1.0"
