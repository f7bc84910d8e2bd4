"""Progress bars on stderr for long operator commands (``cp``, ``verify``, ``convert``,
``gc``), drawn by tqdm; off unless enabled (default: when stderr is a terminal), so
pipes, logs and ``--json`` output stay clean. The commands advance them by bytes as
chunks move, from the I/O threads, so a large node moves the bar while it is copied.

Example::

    >>> import io
    >>> stream = io.StringIO()
    >>> with ProgressBar(4096, "copy", enabled=None, stream=stream) as bar:  # drawn on a tty only
    ...     bar.advance(4096)
    >>> bar.done
    4096
"""

from __future__ import annotations

import sys
import threading
from typing import ClassVar, TextIO

from tqdm import tqdm

from ckptstore._closing import Closing

__all__ = ["ProgressBar"]


class ProgressBar(Closing):
    """``copy:  45%|#####      | 1.2G/2.6G [00:03<00:04, 410MB/s]``, or nothing when
    disabled.

    Example::

        >>> import io
        >>> bar = ProgressBar(10, "verify", unit="nodes", enabled=True, stream=io.StringIO())
        >>> bar.advance()
        >>> bar.done, bar.total
        (1, 10)
    """

    REFRESH_SECONDS: ClassVar[float] = 0.1
    """The bar is redrawn at most this often (tqdm's ``mininterval``)."""

    def __init__(
        self,
        total: int,
        label: str,
        *,
        unit: str = "bytes",
        enabled: bool | None = None,
        stream: TextIO | None = None,
    ) -> None:
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.total = max(total, 0)
        self.done = 0
        self._lock = threading.Lock()  # advanced from several I/O threads at once
        in_bytes = unit == "bytes"
        self._bar = tqdm(
            total=self.total,
            desc=label,
            unit="B" if in_bytes else f" {unit}",
            unit_scale=in_bytes,
            unit_divisor=1024,
            file=self.stream,
            disable=not self.enabled,
            dynamic_ncols=True,
            leave=True,
            mininterval=self.REFRESH_SECONDS,
            miniters=1,  # redraw by time alone: steps are chunks of any size
        )

    def advance(self, amount: int = 1) -> None:
        """Record ``amount`` more units done (from any thread)."""
        with self._lock:
            self.done += amount
            self._bar.update(amount)

    @property
    def percent(self) -> int:
        return 100 if not self.total else min(100, 100 * self.done // self.total)

    def close(self) -> None:
        self._bar.close()
