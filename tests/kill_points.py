"""Kill points for the crash children (crash_child.py, retention_crash_child.py): count
the calls of wrapped functions and SIGKILL this process at the K-th."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any


class KillAt:
    """Counts the calls of every function :meth:`counted` wraps; the ``kill_at``-th call
    (1-based; 0 never) kills this process with SIGKILL before it runs."""

    def __init__(self, kill_at: int) -> None:
        self.kill_at = kill_at
        self.calls = 0

    def counted(self, function: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            if self.calls == self.kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return function(*args, **kwargs)

        return wrapper
