"""ckptstore-gcs: checkpoints in Google Cloud Storage buckets (or an emulator).

Installing this distribution registers the ``gcs`` path type, which serves ``gs://``
and ``gcs://`` URLs; see ``docs/object-stores.md``.

Example::

    from ckptstore import CheckpointManager
    manager = CheckpointManager("gs://bucket/run", "trainer_0", "npz",
                                storage_options={"project": "my-project"})
"""

from ckptstore.object_store import RequestError, RetryPolicy
from ckptstore_gcs.options import GCSOptions
from ckptstore_gcs.path import GCSPath

__all__ = ["GCSOptions", "GCSPath", "RequestError", "RetryPolicy"]
__version__ = "0.1.0"
