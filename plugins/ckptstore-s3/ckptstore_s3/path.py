"""The ``s3`` path type: checkpoints under ``s3://bucket/prefix`` on AWS or any
S3-compatible server, large objects sent as parallel multipart uploads.

Example::

    CheckpointManager("s3://bucket/run", "trainer_0", "npz",
                      storage_options={"endpoint_url": "http://127.0.0.1:9000"})
"""

from __future__ import annotations

from ckptstore.object_store import ObjectStorePath
from ckptstore_s3.client import S3Client
from ckptstore_s3.options import S3Options

__all__ = ["S3Path"]


class S3Path(ObjectStorePath[S3Options, S3Client]):
    """A checkpoint root in an S3 bucket; everything but S3's options, its s3fs
    filesystem and its client is :class:`~ckptstore.object_store.ObjectStorePath`'s.

    Storage options (keyword arguments) override the usual environment variables:
    ``endpoint_url``, ``region``, ``profile``, ``key``/``secret``/``token``, ``anon``,
    ``part_size``, ``multipart_threshold``, ``max_concurrency`` (parts of one object in
    flight), ``max_connections``, ``buffer_bytes`` (memory of one write stream),
    ``retries``, ``connect_timeout``, ``read_timeout``; see :mod:`ckptstore_s3.options`.

    Example::

        storage = S3Path("s3://bucket/run", endpoint_url="http://127.0.0.1:9000")
        storage.write_bytes("trainer_0.1/a", b"hello")
        storage.read_bytes("trainer_0.1/a")  # b'hello'
    """

    name = "s3"
    protocols = ("s3", "s3a")
    atomic_create = True  # PUT with If-None-Match: * (S3Client.put_if_absent)
    bucket_rule = "an S3 URL names a bucket: s3://BUCKET/prefix"
    options_type = S3Options
    client_type = S3Client
