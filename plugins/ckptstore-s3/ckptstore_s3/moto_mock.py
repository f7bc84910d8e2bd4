"""moto's in-process ``mock_aws``, made to serve ckptstore's S3 requests.

``mock_aws`` answers requests inside botocore with synchronous responses, which
aiobotocore (under s3fs and this plugin) cannot await. So while a mock is active,
:class:`~ckptstore_s3.client.S3Client` sends each request the mock would intercept (one
bound for AWS) to moto's own server instead, run in a thread of this process on
127.0.0.1. The server answers from the same in-memory backends as the mock, so buckets
and objects made with boto3 inside the mock are the ones ckptstore reads and writes,
and the other way round.

The server starts the first time a request needs it and then serves every later mock
of the process (moto's backends are the process's, whichever mock is active). moto has
no hook for the end of a mock, and stopping the server costs half a second, so it is
never stopped: its thread is a daemon and ends with the process. Nothing here imports
moto before a test has: without it imported, no mock can be active.

Example::

    >>> intercepted(None), intercepted("https://s3.eu-west-1.amazonaws.com")
    (True, True)
    >>> intercepted("http://127.0.0.1:9000")
    False
    >>> mock_aws_active()  # no mock around this example
    False
"""

from __future__ import annotations

import os
import sys
import threading
from urllib.parse import urlsplit

__all__ = ["intercepted", "mock_aws_active", "server_endpoint"]

_LOOPBACK = "127.0.0.1"
_lock = threading.Lock()
_server: tuple[int, str] | None = None
"""The process id that started the server, and the server's URL."""


def mock_aws_active() -> bool:
    """Whether moto's in-process ``mock_aws`` is active for S3: its botocore hook
    answers requests, and its configuration does not pass S3 through to AWS. Never
    imports moto."""
    models = sys.modules.get("moto.core.models")
    if not getattr(getattr(models, "botocore_stubber", None), "enabled", False):
        return False
    passthrough = getattr(sys.modules.get("moto.core.config"), "passthrough_service", None)
    return not (passthrough is not None and passthrough("s3"))


def intercepted(endpoint_url: str | None) -> bool:
    """Whether ``mock_aws`` intercepts S3 requests sent to ``endpoint_url``: AWS's
    endpoints (``None`` is botocore's default, AWS) and those listed in moto's
    ``MOTO_S3_CUSTOM_ENDPOINTS``."""
    if endpoint_url is None:
        return True
    address = urlsplit(endpoint_url)
    if ".amazonaws.com" in f".{address.hostname or ''}":
        return True
    custom = os.environ.get("MOTO_S3_CUSTOM_ENDPOINTS", "")
    listed = {entry.strip().split("://")[-1] for entry in custom.split(",") if entry.strip()}
    return address.netloc in listed


def server_endpoint() -> str:
    """The URL of moto's server in this process, started on the first call (a forked
    child starts its own: it has its own copy of moto's backends). Raises
    :class:`ImportError` without moto's server extra (flask)."""
    global _server
    with _lock:
        if _server is None or _server[0] != os.getpid():
            _server = (os.getpid(), _start())
        return _server[1]


def _start() -> str:
    """Serve moto's backends on a free port of 127.0.0.1 from a daemon thread, as
    ``moto.server.ThreadedMotoServer`` does, but without an access-log line per request
    (printed to stderr by werkzeug unless logging says otherwise)."""
    from moto.moto_server import werkzeug_app
    from werkzeug.serving import WSGIRequestHandler, make_server

    # moto's request handler where it has one (it keeps S3 metadata names with "_")
    base: type[WSGIRequestHandler] = getattr(werkzeug_app, "MotoRequestHandler", WSGIRequestHandler)

    class QuietHandler(base):  # type: ignore[valid-type, misc]
        def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
            return

    server = make_server(
        _LOOPBACK,
        0,  # the system picks a free port while binding: no race with another process
        werkzeug_app.DomainDispatcherApplication(werkzeug_app.create_backend_app),
        threaded=True,
        request_handler=QuietHandler,
    )
    threading.Thread(
        target=server.serve_forever, name="ckptstore-s3 mock_aws server", daemon=True
    ).start()
    return f"http://{_LOOPBACK}:{server.server_address[1]}"
