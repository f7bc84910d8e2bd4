"""Incremental DCP saves (``Writer(..., incremental=True)``): each rank's node goes
through :func:`~ckptstore.protocol.write_node` with ``incremental=True``, so the
chunks of its large items are stored once per content in the root's chunk store
(docs/design.md, "Incremental checkpoints"), shared with every epoch, rank and job
under the root.

What this module adds: a rank's save records an *intent* naming its chunks (so that a
collection running meanwhile keeps them), and the intent may be deleted only once the
node is committed. DCP commits every rank's node on the coordinator, in
``Writer.finish``, and no rank hears of it afterwards; so each rank hands the keys of
its intents to the coordinator with its write results (:class:`IncrementalItem`), and
the coordinator deletes them after the commit (:func:`release_intents_of`). (The rank
process keeps the keys in the chunk store's own memory of its intents too: a few bytes
per save, as its commits never run there.)
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass

from ckptstore.errors import CorruptCheckpointError
from ckptstore.plugin import PathType
from ckptstore.protocol import INTENT_KIND, INTENTS_DIR
from ckptstore.records import decode_document
from ckptstore.torch._dcp_metadata import StoredItem

__all__ = ["IncrementalItem", "intents_of", "release_intents_of"]


@dataclass(frozen=True)
class IncrementalItem(StoredItem):
    """A written item of an incremental save, with the keys of its rank's intents."""

    intents: tuple[str, ...] = ()


def intents_of(storage: PathType, node: str, epoch: int) -> tuple[str, ...]:
    """The intent records this process made for its save of ``node``'s ``epoch`` under
    ``storage``: one listing of the intents, and each of this node and epoch read to
    keep only those naming this host and process (any other is left for a collection,
    which removes those of dead processes)."""
    start = f"{INTENTS_DIR}/{node}.{epoch}."
    mine: list[str] = []
    for key in storage.list_keys(INTENTS_DIR):
        if not key.startswith(start):
            continue
        data = storage.get_document(key)
        if data is None:
            continue
        try:
            body = decode_document(data, INTENT_KIND, url=storage.display_url, key=key)
        except CorruptCheckpointError:
            continue  # not one this process wrote
        if body.get("host") == socket.gethostname() and body.get("pid") == os.getpid():
            mine.append(key)
    return tuple(mine)


def release_intents_of(storage: PathType, items: Iterable[object]) -> None:
    """After the commit: delete the intents the ranks' ``items`` carry (their commit
    records now keep their chunks). Tidying only: an intent left behind keeps its
    chunks, it never loses any."""
    carried = (item.intents for item in items if isinstance(item, IncrementalItem))
    keys = sorted({key for intents in carried for key in intents})
    if keys:
        with contextlib.suppress(Exception):
            storage.delete(keys)
