"""ckptstore-s3: checkpoints in S3 buckets (AWS or any S3-compatible server).

Installing this distribution registers the ``s3`` path type, which serves ``s3://`` and
``s3a://`` URLs; see ``docs/object-stores.md``. Settings come from the AWS environment
or ``storage_options`` (e.g. ``{"region": "eu-west-1"}``); the example runs against a
local moto server.

Example::

    >>> import boto3
    >>> from contextlib import ExitStack
    >>> from ckptstore.testing import in_process_moto
    >>> stack = ExitStack()
    >>> moto = stack.enter_context(in_process_moto())  # a local S3 server for the example
    >>> s3 = boto3.client("s3", endpoint_url=moto.endpoint_url)
    >>> _ = s3.create_bucket(Bucket="quickstart")
    >>> from ckptstore import CheckpointManager, LocalSession
    >>> session = LocalSession()
    >>> session.workspace("trainer_0")["w"] = np.ones(2)
    >>> manager = CheckpointManager("s3://quickstart/run", "trainer_0", "npz")
    >>> _ = session.run(manager.init(["trainer_0"]))
    >>> _ = session.run(manager.save(1))
    >>> for key in manager.location.storage.list_keys():
    ...     print(key)
    _ckptstore/epoch-1/trainer_0.commit.json
    trainer_0.1/blobs.npz
    trainer_0.1/ckptstore.manifest.json
    >>> stack.close()
"""

from ckptstore.object_store import RequestError, RetryPolicy
from ckptstore_s3.options import S3Options
from ckptstore_s3.path import S3Path

__all__ = ["RequestError", "RetryPolicy", "S3Options", "S3Path"]
__version__ = "0.1.0"
