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
the coordinator deletes them after the commit (:func:`release_intents_of`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass

from ckptstore.plugin import PathType
from ckptstore.protocol._chunks import INTENTS_DIR
from ckptstore.torch._dcp_metadata import StoredItem

__all__ = ["IncrementalItem", "intents_of", "release_intents_of"]


@dataclass(frozen=True)
class IncrementalItem(StoredItem):
    """A written item of an incremental save, with the keys of its rank's intents."""

    intents: tuple[str, ...] = ()


def intents_of(storage: PathType, node: str, epoch: int) -> tuple[str, ...]:
    """The intent records of ``node``'s saves of ``epoch`` under ``storage`` (this
    rank's, just made; the writer lease keeps other jobs from saving this epoch, so any
    other is left by a save of it that died, whose chunks nothing committed needs)."""
    start = f"{INTENTS_DIR}/{node}.{epoch}."
    return tuple(key for key in storage.list_keys(INTENTS_DIR) if key.startswith(start))


def release_intents_of(storage: PathType, items: Iterable[object]) -> None:
    """After the commit: delete the intents the ranks' ``items`` carry (their commit
    records now keep their chunks). Tidying only: an intent left behind keeps its
    chunks, it never loses any."""
    carried = (item.intents for item in items if isinstance(item, IncrementalItem))
    keys = sorted({key for intents in carried for key in intents})
    if keys:
        with contextlib.suppress(Exception):
            storage.delete(keys)
