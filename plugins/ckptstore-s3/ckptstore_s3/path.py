"""The ``s3`` path type: checkpoints under ``s3://bucket/prefix`` on AWS or any
S3-compatible server, large objects sent as parallel multipart uploads.

Example::

    >>> options = s3_options("manager-run")  # endpoint and keys of a fresh bucket
    >>> from ckptstore import CheckpointManager, LocalSession
    >>> session = LocalSession()
    >>> session.workspace("trainer_0")["w"] = np.arange(3.0)
    >>> manager = CheckpointManager("s3://manager-run/run", "trainer_0", "npz",
    ...                             storage_options=options)
    >>> _ = session.run(manager.init(["trainer_0"]))
    >>> _ = session.run(manager.save(1))
    >>> session.workspace("trainer_0")["w"][:] = 0
    >>> _ = session.run(manager.load(1))
    >>> session.workspace("trainer_0")["w"]
    array([0., 1., 2.])
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

        >>> options = s3_options("path-type")  # endpoint and keys of a fresh bucket
        >>> storage = S3Path("s3://path-type/run", **options)
        >>> storage.write_bytes("trainer_0.1/a", b"hello")
        >>> storage.read_bytes("trainer_0.1/a")
        b'hello'
    """

    name = "s3"
    protocols = ("s3", "s3a")
    atomic_create = True  # PUT with If-None-Match: * (S3Client.put_if_absent)
    atomic_replace = True  # PUT with If-Match: <ETag> (S3Client.put_if_version)
    bucket_rule = "an S3 URL names a bucket: s3://BUCKET/prefix"
    options_type = S3Options
    client_type = S3Client
