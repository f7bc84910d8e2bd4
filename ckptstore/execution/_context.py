"""A tiny stack of "current" objects (node, task group, job), one per context variable."""

from __future__ import annotations

from contextvars import ContextVar
from typing import Generic, TypeVar

T = TypeVar("T")


class ContextStack(Generic[T]):
    """A stack whose top is "the current one", safe across threads and asyncio tasks."""

    def __init__(self, name: str) -> None:
        self._var: ContextVar[tuple[T, ...]] = ContextVar(name, default=())

    def push(self, item: T) -> None:
        self._var.set((*self._var.get(), item))

    def pop(self, item: T) -> None:
        stack = self._var.get()
        if not stack or stack[-1] is not item:
            raise RuntimeError(f"context exited out of order: {item!r} is not the current one")
        self._var.set(stack[:-1])

    def top(self) -> T | None:
        stack = self._var.get()
        return stack[-1] if stack else None
