"""The ``gcs`` path type: checkpoints under ``gs://bucket/prefix`` in Google Cloud
Storage or an emulator, large objects sent as parallel composite uploads.

Example::

    >>> options = gcs_options("bucket")  # endpoint and token of a fresh bucket
    >>> from ckptstore import CheckpointManager, LocalSession
    >>> session = LocalSession()
    >>> session.workspace("trainer_0")["w"] = np.arange(3.0)
    >>> manager = CheckpointManager("gs://bucket/run", "trainer_0", "npz", storage_options=options)
    >>> _ = session.run(manager.init(["trainer_0"]))
    >>> _ = session.run(manager.save(1))
    >>> session.workspace("trainer_0")["w"][:] = 0
    >>> _ = session.run(manager.load(1))
    >>> session.workspace("trainer_0")["w"]
    array([0., 1., 2.])
    >>> manager.location.storage.close()
"""

from __future__ import annotations

from ckptstore.object_store import ObjectStorePath
from ckptstore_gcs.client import GCSClient
from ckptstore_gcs.options import GCSOptions

__all__ = ["GCSPath"]


class GCSPath(ObjectStorePath[GCSOptions, GCSClient]):
    """A checkpoint root in a GCS bucket. Its options, gcsfs filesystem and JSON-API
    client are GCS's own; the rest comes from :class:`~ckptstore.object_store.ObjectStorePath`.

    Storage options (keyword arguments) override the usual environment variables:
    ``endpoint_url``, ``project``, ``token``, ``part_size``, ``composite_threshold``,
    ``max_concurrency`` (parts of one object in flight), ``buffer_bytes`` (memory of one
    write stream), ``retries``, ``connect_timeout``, ``read_timeout``; see
    :mod:`ckptstore_gcs.options`.

    Example::

        >>> options = gcs_options("bucket")  # endpoint and token of a fresh bucket
        >>> storage = GCSPath("gs://bucket/run", **options)  # e.g. token="/keys/sa.json"
        >>> storage.write_bytes("a", b"hello")
        >>> storage.size("a"), storage.read_bytes("a", offset=1, length=3)
        (5, b'ell')
        >>> storage.close()
    """

    name = "gcs"
    protocols = ("gs", "gcs")
    atomic_create = True  # upload with ifGenerationMatch=0 (GCSClient.put_if_absent)
    atomic_replace = True  # upload with ifGenerationMatch=<generation> (put_if_version)
    bucket_rule = "a GCS URL names a bucket: gs://BUCKET/prefix"
    options_type = GCSOptions
    client_type = GCSClient
