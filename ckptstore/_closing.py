"""The base of objects that a ``with`` block closes (sessions, progress bars, test servers)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType
from typing import Self

__all__ = ["Closing"]


class Closing(ABC):
    """``with obj:`` gives ``obj`` and calls :meth:`close` when the block ends, however
    it ends."""

    @abstractmethod
    def close(self) -> None:
        """Release what the object holds."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
