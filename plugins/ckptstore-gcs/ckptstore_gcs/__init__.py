"""ckptstore-gcs: checkpoints in Google Cloud Storage buckets (or an emulator).

Installing this distribution registers the ``gcs`` path type, which serves ``gs://``
and ``gcs://`` URLs; see ``docs/object-stores.md``. Settings come from the Google
environment or ``storage_options`` (e.g. ``{"project": "my-project"}``); the example
runs against a local emulator.

Example::

    >>> options = gcs_options("bucket")  # endpoint and token of a fresh bucket
    >>> from ckptstore import CheckpointManager, LocalSession
    >>> session = LocalSession()
    >>> session.workspace("trainer_0")["w"] = np.ones(2)
    >>> manager = CheckpointManager("gs://bucket/run", "trainer_0", "npz", storage_options=options)
    >>> _ = session.run(manager.init(["trainer_0"]))
    >>> _ = session.run(manager.save(1))
    >>> import re
    >>> for key in manager.location.storage.list_keys():
    ...     print(re.sub("attempt-[0-9a-f]{12}", "attempt-<id>", key))
    _ckptstore/epoch-1/trainer_0.commit.json
    trainer_0.1/attempt-<id>/blobs.npz
    trainer_0.1/attempt-<id>/ckptstore.manifest.json
    >>> manager.location.storage.close()
"""

from ckptstore.object_store import RequestError, RetryPolicy
from ckptstore_gcs.options import GCSOptions
from ckptstore_gcs.path import GCSPath

__all__ = ["GCSOptions", "GCSPath", "RequestError", "RetryPolicy"]
__version__ = "0.1.0"
