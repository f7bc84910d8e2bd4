"""The base of the objects (node, task group, job) that are "the current one" in their
``with`` block."""

from __future__ import annotations

from contextvars import ContextVar
from types import TracebackType
from typing import ClassVar, Self

__all__ = ["Current"]


class Current:
    """An object that is "the current one" of its kind inside its ``with`` block.

    A subclass names its stack once (``class Node(Current, context="ckptstore_node")``);
    ``with obj:`` pushes ``obj`` on that stack and leaving the block pops it again. The
    stack is a context variable, so it is safe across threads and asyncio tasks.
    """

    _stack: ClassVar[ContextVar[tuple[Current, ...]]]

    def __init_subclass__(cls, *, context: str | None = None, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if context is not None:
            cls._stack = ContextVar(context, default=())

    @classmethod
    def _innermost(cls) -> Self | None:
        """The object of the innermost ``with`` block of this kind, if any."""
        stack = cls._stack.get()
        return stack[-1] if stack and isinstance(stack[-1], cls) else None

    def __enter__(self) -> Self:
        self._stack.set((*self._stack.get(), self))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        stack = self._stack.get()
        if not stack or stack[-1] is not self:
            raise RuntimeError(f"context exited out of order: {self!r} is not the current one")
        self._stack.set(stack[:-1])
