"""A dependency-free progress bar on stderr for long operator commands.

It draws only when enabled (default: stderr is a terminal), redraws at most once per
percent, and ends with a newline.

Example::

    with ProgressBar(total_bytes, "copy", enabled=None) as bar:
        bar.advance(chunk_bytes)
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import TextIO

from ckptstore.cli._common import format_bytes

__all__ = ["ProgressBar"]

WIDTH = 30


class ProgressBar:
    """``label [#######.......] 45%  done/total unit``.

    Example::

        bar = ProgressBar(10, "verify", unit="nodes", enabled=True)
        bar.advance()
    """

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
        self.label = label
        self.unit = unit
        self.done = 0
        self._drawn = -1

    def advance(self, amount: int = 1) -> None:
        """Record ``amount`` more units done and redraw if the percentage changed."""
        self.done = min(self.done + amount, self.total) if self.total else self.done + amount
        percent = self.percent
        if self.enabled and percent != self._drawn:
            self._drawn = percent
            filled = WIDTH * percent // 100
            bar = "#" * filled + "." * (WIDTH - filled)
            self.stream.write(f"\r{self.label} [{bar}] {percent:3d}%  {self._amounts()}")
            self.stream.flush()

    @property
    def percent(self) -> int:
        return 100 if not self.total else 100 * self.done // self.total

    def _amounts(self) -> str:
        if self.unit == "bytes":
            return f"{format_bytes(self.done)}/{format_bytes(self.total)}"
        return f"{self.done}/{self.total} {self.unit}"

    def close(self) -> None:
        if self.enabled and self._drawn >= 0:
            self.stream.write("\n")
            self.stream.flush()

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
