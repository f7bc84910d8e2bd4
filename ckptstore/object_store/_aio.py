"""Running many requests at once on an event loop, all or none.

Example::

    >>> import asyncio
    >>> from functools import partial
    >>> async def upload(i):
    ...     return i * i
    >>> asyncio.run(gather_all([partial(upload, i) for i in range(4)]))
    [0, 1, 4, 9]
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

__all__ = ["gather_all"]

T = TypeVar("T")


async def gather_all(factories: Sequence[Callable[[], Awaitable[T]]]) -> list[T]:
    """Run every coroutine; on the first failure cancel the others and raise it."""
    tasks = [asyncio.ensure_future(factory()) for factory in factories]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
