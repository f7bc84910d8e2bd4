"""moto's server in a thread of the test process, for S3 code that moto's in-process
``mock_aws`` cannot serve by itself.

ckptstore's own S3 requests need nothing: while ``mock_aws`` is active, the S3 plugin
sends them to moto's server in this process by itself (see docs/testing.md). Other
aiobotocore code does not: ``mock_aws`` answers inside botocore with synchronous
responses, which aiobotocore (under s3fs) cannot await. :func:`in_process_moto` starts
moto's server in a thread on 127.0.0.1 and points ``AWS_ENDPOINT_URL_S3`` at it; since
the server and ``mock_aws`` share moto's in-memory backends, s3fs then sees the buckets
and objects made inside the mock, by boto3 and by ckptstore alike. It also serves an
endpoint the mock intercepts that the S3 plugin does not reroute
(:class:`~ckptstore.errors.InProcessMockError`), and is a light S3 server without
``mock_aws``.

Example::

    >>> import boto3, fsspec
    >>> from moto import mock_aws
    >>> from ckptstore.tree import load_tree, save_tree
    >>> with mock_aws():
    ...     s3 = boto3.client("s3", region_name="us-east-1")
    ...     _ = s3.create_bucket(Bucket="bucket")
    ...     save_tree("s3://bucket/run", 1, {"step": 1})  # plain mock_aws is enough here
    ...     with in_process_moto():  # for s3fs, which cannot use the mock by itself
    ...         fs = fsspec.filesystem("s3", skip_instance_cache=True)
    ...         print(fs.ls("bucket/run"))
    ['bucket/run/_ckptstore', 'bucket/run/tree.1']
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from ckptstore.testing.servers import LOOPBACK, free_port

__all__ = ["InProcessMoto", "in_process_moto"]

_FAKE_ENVIRONMENT = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@dataclass(frozen=True)
class InProcessMoto:
    """A running in-process moto server.

    ``storage_options`` point a checkpoint at it explicitly (the environment already
    does, inside :func:`in_process_moto`).
    """

    endpoint_url: str
    storage_options: dict[str, object] = field(default_factory=dict)


@contextmanager
def in_process_moto(*, host: str = LOOPBACK, port: int | None = None) -> Iterator[InProcessMoto]:
    """Run moto's S3 server in a thread and point ``AWS_ENDPOINT_URL_S3`` at it.

    The server listens on ``host`` (127.0.0.1) for the duration. Fake credentials and a
    region are set only where the environment has none (``mock_aws`` sets its own).
    Everything is restored on exit. Works inside or outside ``mock_aws``."""
    from moto.server import ThreadedMotoServer  # moto is a test dependency only

    port = port or free_port(host)
    endpoint = f"http://{host}:{port}"
    server = ThreadedMotoServer(ip_address=host, port=port, verbose=False)
    werkzeug = logging.getLogger("werkzeug")
    saved_level = werkzeug.level
    werkzeug.setLevel(logging.ERROR)  # no access log line per request
    overrides = {"AWS_ENDPOINT_URL_S3": endpoint}
    overrides.update({k: v for k, v in _FAKE_ENVIRONMENT.items() if not os.environ.get(k)})
    saved = {name: os.environ.get(name) for name in overrides}
    server.start()
    try:
        os.environ.update(overrides)
        yield InProcessMoto(
            endpoint, {"endpoint_url": endpoint, "client_kwargs": {"region_name": "us-east-1"}}
        )
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        server.stop()
        werkzeug.setLevel(saved_level)
