"""``ckptstore.testing``: a pytest plugin with local S3 and GCS servers for your tests.

Enable it with ``-p ckptstore.testing`` (or ``pytest_plugins = ["ckptstore.testing"]``
in your top-level ``conftest.py``); installed through its ``pytest11`` entry point it
is active by itself. Servers start only when a test asks for a fixture. See
``docs/testing.md``.

Example::

    >>> import contextlib, io, pytest
    >>> tests = '''
    ... import numpy as np
    ... from ckptstore import CheckpointManager, LocalSession
    ...
    ... def test_checkpoint_roundtrip(s3_url):  # a fresh bucket on a local S3 server
    ...     session = LocalSession()
    ...     session.workspace("trainer_0")["w"] = np.ones(2)
    ...     manager = CheckpointManager(s3_url, "trainer_0", "npz")
    ...     session.run(manager.init(["trainer_0"]))
    ...     session.run(manager.save(1))
    ...     session.workspace("trainer_0")["w"][:] = 0
    ...     session.run(manager.load(1))
    ...     assert session.workspace("trainer_0")["w"].tolist() == [1.0, 1.0]
    ... '''
    >>> _ = open("test_roundtrip_on_s3.py", "w").write(tests)
    >>> with contextlib.redirect_stdout(io.StringIO()) as out:  # i.e. run pytest
    ...     code = pytest.main(["-q", "test_roundtrip_on_s3.py"])
    >>> int(code), out.getvalue().splitlines()[-1]
    (0, '1 passed...')
"""

from ckptstore.testing.fixtures import (
    gcs_faults,
    gcs_server,
    gcs_storage_options,
    gcs_strict_server,
    gcs_strict_url,
    gcs_url,
    s3_faults,
    s3_mock_aws,
    s3_server,
    s3_storage_options,
    s3_url,
)
from ckptstore.testing.imports import imported_modules
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
    "gcs_strict_server",
    "gcs_strict_url",
    "gcs_url",
    "imported_modules",
    "in_process_moto",
    "s3_faults",
    "s3_mock_aws",
    "s3_server",
    "s3_storage_options",
    "s3_url",
    "wait_for",
]
