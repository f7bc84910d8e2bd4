"""``ckptstore.testing``: a pytest plugin with local S3 and GCS servers for your tests.

Enable it with ``-p ckptstore.testing`` (or ``pytest_plugins = ["ckptstore.testing"]``
in your top-level ``conftest.py``); installed through its ``pytest11`` entry point it
is active by itself. Servers start only when a test asks for a fixture. See
``docs/testing.md``.

Example::

    def test_checkpoint_roundtrip(s3_url):
        manager = CheckpointManager(s3_url, "trainer_0")
        ...
"""

from ckptstore.testing.fixtures import (
    gcs_faults,
    gcs_server,
    gcs_storage_options,
    gcs_url,
    s3_faults,
    s3_mock_aws,
    s3_server,
    s3_storage_options,
    s3_url,
)
from ckptstore.testing.in_process import InProcessMoto, in_process_moto
from ckptstore.testing.proxy import FaultProxy, RecordedRequest
from ckptstore.testing.servers import GcsEmulator, MotoServer, ServerProcess, free_port, wait_for

__all__ = [
    "FaultProxy",
    "GcsEmulator",
    "InProcessMoto",
    "MotoServer",
    "RecordedRequest",
    "ServerProcess",
    "free_port",
    "gcs_faults",
    "gcs_server",
    "gcs_storage_options",
    "gcs_url",
    "in_process_moto",
    "s3_faults",
    "s3_mock_aws",
    "s3_server",
    "s3_storage_options",
    "s3_url",
    "wait_for",
]
