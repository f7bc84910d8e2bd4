"""GCS parallel composite uploads behind ckptstore's
:class:`~ckptstore.object_store.MultipartUpload`: each part is uploaded as a temporary
object, completing composes them into the object (32 at a time, in rounds) and deletes
them; aborting deletes them.

Example::

    >>> options = gcs_options("bucket")  # endpoint and token of a fresh bucket
    >>> from ckptstore_gcs import GCSPath
    >>> storage = GCSPath("gs://bucket/run", **options)
    >>> client = storage.client
    >>> upload = GCSCompositeUpload(client, "run/trainer_0.3/blobs.npz")
    >>> async def send():
    ...     await upload.start()
    ...     await upload.upload_part(1, b"world")  # parts in any order
    ...     await upload.upload_part(0, b"hello ")
    ...     await upload.complete()
    >>> client.run(send)
    >>> storage.list_keys()  # the temporary part objects are gone
    ['trainer_0.3/blobs.npz']
    >>> storage.read_bytes("trainer_0.3/blobs.npz")
    b'hello world'
    >>> storage.close()
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING

from ckptstore.object_store import Body, MultipartUpload, gather_all

if TYPE_CHECKING:
    from ckptstore_gcs.client import GCSClient

__all__ = ["MAX_COMPOSE", "GCSCompositeUpload"]

MAX_COMPOSE = 32
"""GCS composes at most this many objects in one request."""


class GCSCompositeUpload(MultipartUpload):
    """One parallel composite upload; part objects are named after the key, a random
    token and the part's index.

    Example::

        >>> options = gcs_options("bucket")  # endpoint and token of a fresh bucket
        >>> from ckptstore.object_store import upload_in_parts
        >>> from ckptstore_gcs import GCSPath
        >>> client = GCSPath("gs://bucket/run", **options).client
        >>> parts = [b"one ", b"two ", b"three"]
        >>> client.run(lambda: upload_in_parts(GCSCompositeUpload(client, "run/blob"), 3,
        ...                                    parts.__getitem__, limit=16))
        >>> client.run(lambda: client.get("run/blob", 0, None))
        b'one two three'
        >>> client.close()
    """

    def __init__(self, client: GCSClient, key: str) -> None:
        super().__init__(key)
        self._client = client
        self._token = secrets.token_hex(6)
        self._parts: dict[int, str] = {}

    def part_name(self, index: int) -> str:
        """The temporary object holding part ``index``."""
        return f"{self.key}.ckptstore-part-{self._token}-{index:05d}"

    async def upload_part(self, index: int, body: Body) -> None:
        name = self.part_name(index)
        self._parts[index] = name
        await self._client.put(name, body)

    async def complete(self) -> None:
        """Compose the parts (in order) into the object, 32 at a time, then delete them
        and any intermediate objects; on failure the temporary objects are deleted too."""
        parts = self._take_parts()
        created: list[str] = []
        try:
            level = parts
            round_number = 0
            while len(level) > MAX_COMPOSE:
                groups = [level[i : i + MAX_COMPOSE] for i in range(0, len(level), MAX_COMPOSE)]
                names = [
                    f"{self.key}.ckptstore-compose-{self._token}-{round_number}-{index:05d}"
                    for index in range(len(groups))
                ]
                created.extend(names)
                await gather_all(
                    [
                        partial(self._client.compose, name, group)
                        for name, group in zip(names, groups, strict=True)
                    ]
                )
                level = names
                round_number += 1
            await self._client.compose(self.key, level)
        finally:
            await asyncio.shield(_delete_quietly(self._client, [*parts, *created]))

    async def abort(self) -> None:
        """Delete the parts uploaded so far (failures are ignored)."""
        parts = self._take_parts()
        if parts:
            await _delete_quietly(self._client, parts)

    def _take_parts(self) -> list[str]:
        """The part objects in index order, forgotten here (deleted by the caller)."""
        parts = [self._parts[index] for index in sorted(self._parts)]
        self._parts.clear()
        return parts


async def _delete_quietly(client: GCSClient, keys: Sequence[str]) -> None:
    try:
        await client.delete_many(keys)
    except OSError:
        return
