"""The ``gcs`` path type: checkpoints under ``gs://bucket/prefix`` in Google Cloud
Storage or an emulator, large objects sent as parallel composite uploads.

Example::

    CheckpointManager("gs://bucket/run", "trainer_0", "npz",
                      storage_options={"project": "my-project"})
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

        GCSPath("gs://bucket/run", project="my-project", token="/keys/sa.json").size("a")
    """

    name = "gcs"
    protocols = ("gs", "gcs")
    atomic_create = True  # upload with ifGenerationMatch=0 (GCSClient.put_if_absent)
    bucket_rule = "a GCS URL names a bucket: gs://BUCKET/prefix"
    options_type = GCSOptions
    client_type = GCSClient
