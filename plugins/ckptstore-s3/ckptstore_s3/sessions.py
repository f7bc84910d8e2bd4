"""One botocore session per AWS profile and environment in a process, shared by every
S3 client ckptstore makes there.

A client made from a new session loads the S3 service's model again: 50-120 ms here
before its first request, paid by every ``CheckpointManager``, restore and CLI command
on an S3 root. A client made from a session that made one before takes about 5 ms.
Credentials given as options go to each client, not to the session. Those the session
finds itself (environment, profile, instance role) follow its refresh rules; a change
to any ``AWS_*`` variable, or another profile, gets a session of its own; the
:data:`KEPT` used last are kept.

Clients are created on fsspec's I/O thread (``set_session`` runs there), so one thread
uses a session at a time.

Example::

    >>> shared_session(None) is shared_session(None)
    True
    >>> shared_session("staging") is shared_session(None)
    False
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import Any

__all__ = ["KEPT", "shared_session"]

KEPT = 8
"""Sessions kept at most (a job rotating credentials in its environment makes one per
rotation)."""

_sessions: OrderedDict[tuple[str | None, tuple[tuple[str, str], ...]], Any] = OrderedDict()
_lock = threading.Lock()


def shared_session(profile: str | None) -> Any:
    """The process's aiobotocore session for ``profile`` and the ``AWS_*`` environment
    variables as they are now."""
    from aiobotocore.session import AioSession

    environment = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_")))
    key = (profile, environment)
    with _lock:
        session = _sessions.get(key)
        if session is None:
            session = _sessions[key] = AioSession(profile=profile)
            while len(_sessions) > KEPT:
                _sessions.popitem(last=False)
        _sessions.move_to_end(key)
        return session
