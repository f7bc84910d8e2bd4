"""Listing a prefix around one part of it: what :meth:`ObjectStoreClient.list_keys_except`
does on a store that lists in key order from a given key (S3, GCS), with one listing
when the part is empty and two otherwise.

Example (a "store" of four keys; ``keys_after(None)`` lists all, ``keys_after(skip)``
those after every key under ``skip``)::

    >>> import asyncio
    >>> stored = ["c/a", "c/chunks/1", "c/chunks/2", "c/d"]
    >>> async def keys_after(skip):
    ...     for key in stored:
    ...         if skip is None or key >= skip and not key.startswith(skip):
    ...             yield key
    >>> asyncio.run(keys_around(keys_after, "c/chunks/"))
    ['c/a', 'c/d']
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable

__all__ = ["KeysAfter", "keys_around"]

KeysAfter = Callable[[str | None], AsyncGenerator[str, None]]
"""A store's listing of one prefix, in code point order (UTF-8 byte order): every key
(``None``), or from the first key after every key under a given part (a server may send
some before it: they are left out here)."""


async def keys_around(keys_after: KeysAfter, skip: str) -> list[str]:
    """The keys ``keys_after`` lists but those starting with ``skip``: listed up to the
    first key under ``skip`` (all, if there is none), then from after the last."""
    keys: list[str] = []
    listing = keys_after(None)
    async for key in listing:
        if key.startswith(skip):
            break
        keys.append(key)
    else:
        return keys
    await listing.aclose()
    async for key in keys_after(skip):
        if key >= skip and not key.startswith(skip):
            keys.append(key)
    return keys
