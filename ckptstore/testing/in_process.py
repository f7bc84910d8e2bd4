"""moto's in-process ``mock_aws`` for code that checkpoints to S3 through ckptstore.

``mock_aws`` answers requests inside botocore with synchronous responses; aiobotocore
(under s3fs and ckptstore's S3 plugin) cannot await them, so under plain ``mock_aws``
every ckptstore S3 request raises :class:`~ckptstore.errors.InProcessMockError`.
:func:`in_process_moto` starts moto's own server in a thread of this process on
127.0.0.1 and points ``AWS_ENDPOINT_URL_S3`` at it: ckptstore then talks HTTP to it,
and since the server and ``mock_aws`` share moto's in-memory backends, buckets and
objects made with boto3 inside ``mock_aws`` are the ones ckptstore sees, and back.

Example::

    >>> import boto3
    >>> from moto import mock_aws
    >>> from ckptstore.tree import load_tree, save_tree
    >>> with mock_aws():
    ...     s3 = boto3.client("s3", region_name="us-east-1")
    ...     _ = s3.create_bucket(Bucket="bucket")
    ...     with in_process_moto():  # without it: InProcessMockError
    ...         save_tree("s3://bucket/run", 1, {"step": 1})
    ...         print(load_tree("s3://bucket/run"))
    ...     print(s3.list_objects_v2(Bucket="bucket")["KeyCount"] > 0)  # boto3 sees it too
    {'step': 1}
    True
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
    """Run moto's server in a thread on ``host`` (127.0.0.1) and point
    ``AWS_ENDPOINT_URL_S3`` at it for the duration; fake credentials and a region are
    set only where the environment has none (``mock_aws`` sets its own). Everything is
    restored on exit. Works inside or outside ``mock_aws``."""
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
