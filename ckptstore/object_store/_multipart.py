"""Objects uploaded in parts: the backend's session interface, and the parallel upload
of an object already in memory.

A :class:`MultipartUpload` is one object on its way up: :meth:`~MultipartUpload.start`,
parts uploaded in any order and in parallel, then :meth:`~MultipartUpload.complete`
(the object appears whole) or :meth:`~MultipartUpload.abort` (nothing appears). S3 maps
it onto its multipart API; GCS uploads temporary part objects and composes them.

Example::

    >>> import asyncio
    >>> class InMemoryUpload(MultipartUpload):
    ...     def __init__(self, key):
    ...         super().__init__(key)
    ...         self.parts, self.done = {}, None
    ...     async def upload_part(self, index, body):
    ...         self.parts[index] = bytes(body) if isinstance(body, bytes) else body.read()
    ...     async def complete(self):
    ...         self.done = b"".join(self.parts[i] for i in sorted(self.parts))
    ...     async def abort(self):
    ...         self.parts.clear()
    >>> upload = InMemoryUpload("run/trainer_0.3/blobs.npz")
    >>> asyncio.run(upload_in_parts(upload, 3, lambda i: str(i).encode(), limit=16))
    >>> upload.done
    b'012'
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable
from functools import partial

from ckptstore.object_store._aio import gather_all
from ckptstore.object_store._body import Body

__all__ = ["MultipartUpload", "upload_in_parts"]


class MultipartUpload(ABC):
    """One object uploaded in parts, numbered from 0 (each retried on its own).

    Example::

        >>> class MyUpload(MultipartUpload):
        ...     async def upload_part(self, index, body): ...
        ...     async def complete(self): ...
        ...     async def abort(self): ...
        >>> MyUpload("run/a").key
        'run/a'
    """

    def __init__(self, key: str) -> None:
        self.key = key

    async def start(self) -> None:
        """Begin the upload, before the first part (the default needs no request)."""

    @abstractmethod
    async def upload_part(self, index: int, body: Body) -> None:
        """Upload part ``index``; parts may go up concurrently and in any order."""

    @abstractmethod
    async def complete(self) -> None:
        """Make the object the concatenation of every part uploaded, in index order."""

    @abstractmethod
    async def abort(self) -> None:
        """Give up: the object is not created (or keeps its old value). Failures are
        ignored: a bucket's lifecycle rules clean up what this cannot."""


async def upload_in_parts(
    upload: MultipartUpload, count: int, part: Callable[[int], Body], *, limit: int
) -> None:
    """Upload ``count`` parts (``part(i)`` builds part ``i``'s body when its turn comes),
    at most ``limit`` at once, then complete the upload; on any failure abort it."""
    await upload.start()
    slots = asyncio.Semaphore(limit)

    async def one(index: int) -> None:
        async with slots:
            await upload.upload_part(index, part(index))

    try:
        await gather_all([partial(one, index) for index in range(count)])
        await upload.complete()
    except BaseException:
        await asyncio.shield(upload.abort())
        raise
