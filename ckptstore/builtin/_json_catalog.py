"""The ``json`` metadata handler: a small catalog beside the checkpoints.

One document per committed epoch, ``<db_prefix>/_ckptstore/catalog/epoch-<N>.json``,
with its nodes and sizes: two jobs writing different epochs never touch the same
object, so neither can lose the other's entries. The catalog is an index of the
commit records (see :mod:`ckptstore.builtin._catalog`): a missing, damaged or stale
catalog is rebuilt from them, and ``last_epoch`` answers from storage.

Example::

    >>> from ckptstore import MultiNodeCheckpointManager
    >>> manager = MultiNodeCheckpointManager("ckpt", "zarr", metadata_handler="json")
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ckptstore.builtin._catalog import CatalogEntry, IndexCatalog
from ckptstore.errors import CatalogCorruptError, CorruptCheckpointError
from ckptstore.plugin import MetadataHandler, hookimpl
from ckptstore.protocol import EpochCommit
from ckptstore.records import CONTROL_DIR, decode_document, encode_document, json_int

__all__ = ["CATALOG_DIR", "LEGACY_CATALOG_KEY", "JsonCatalog", "entry_key"]

CATALOG_DIR = f"{CONTROL_DIR}/catalog"
LEGACY_CATALOG_KEY = f"{CONTROL_DIR}/catalog.json"  # one document for all epochs, up to 0.x
ENTRY_KIND = "ckptstore.catalog-entry"
_ENTRY = re.compile(r"epoch-(\d+)\.json")


def entry_key(epoch: int) -> str:
    """Where the catalog entry of ``epoch`` is stored."""
    return f"{CATALOG_DIR}/epoch-{epoch}.json"


class JsonCatalog(IndexCatalog):
    """Committed epochs as JSON documents next to the checkpoints, one per epoch.

    ``last_epoch(user_epoch=N)`` checks that epoch ``N`` is committed on every node and
    returns it (the user's choice is never silently replaced); ``last_epoch()`` returns
    the newest epoch committed on every node, or ``None``.

    Example::

        >>> from ckptstore import Job, JobRunner, LocalSession, Node, Task, epoch_limiter
        >>> with Job() as job, Node("trainer_0"):
        ...     with job.init_group:
        ...         _ = Task(lambda ws: ws.update(w=np.zeros(2)))
        ...     _ = Task(lambda ws: ws["w"].__iadd__(1))
        ...     done = epoch_limiter(job, 2)
        >>> from ckptstore import CheckpointManager
        >>> handler = JsonCatalog()
        >>> manager = CheckpointManager("ckpt", "trainer_0", "npz", metadata_handler=handler)
        >>> JobRunner(job, manager).train(LocalSession())
        2
        >>> sorted(handler.epochs())  # once the job saved
        [0, 1, 2]
    """

    name = "json"

    def _entry_keys(self) -> dict[int, str]:
        """The catalog's entries by epoch, from one listing of the catalog directory."""
        keys = {}
        for key in self.require_storage().list_keys(CATALOG_DIR):
            match = _ENTRY.fullmatch(key[len(CATALOG_DIR) + 1 :])
            if match is not None:  # else a writer's temporary file, or something else
                keys[int(match.group(1))] = key
        return keys

    def _catalogued_epochs(self) -> set[int]:
        return set(self._entry_keys())  # one LIST, no entry read

    def _read_entry(self, epoch: int) -> CatalogEntry | None:
        return self._decode(epoch, entry_key(epoch))

    def _read_entries(self) -> dict[int, CatalogEntry]:
        entries = {}
        for epoch, key in sorted(self._entry_keys().items()):
            entry = self._decode(epoch, key)
            if entry is not None:  # else forgotten since it was listed
                entries[epoch] = entry
        return entries

    def _decode(self, epoch: int, key: str) -> CatalogEntry | None:
        storage = self.require_storage()
        try:
            data = storage.get_document(key)  # refused if larger than the document limit
            if data is None:
                return None
            raw = decode_document(data, ENTRY_KIND, url=storage.display_url, key=key)
            if json_int(raw, "epoch") != epoch:
                raise ValueError(f"it describes epoch {raw['epoch']}")
            return CatalogEntry.from_json(epoch, raw)
        except (CorruptCheckpointError, KeyError, TypeError, ValueError) as error:
            raise CatalogCorruptError(str(error), url=storage.display_url, file=key) from None

    def _put_entry(self, record: EpochCommit) -> None:
        entry = CatalogEntry.from_commit(record)
        body = {"epoch": entry.epoch, **entry.to_json()}
        storage, key = self.require_storage(), entry_key(entry.epoch)
        try:
            storage.put_document(key, encode_document(ENTRY_KIND, body))
        except CorruptCheckpointError as error:  # a link in place of the catalog directory
            raise CatalogCorruptError(str(error), url=storage.display_url, file=key) from None

    def _drop_entries(self, epochs: Sequence[int]) -> None:
        self.require_storage().delete([entry_key(epoch) for epoch in epochs])

    def _reset(self) -> None:
        storage = self.require_storage()
        storage.delete_tree(CATALOG_DIR)  # a link in its place is removed, never followed
        storage.delete([LEGACY_CATALOG_KEY])


@hookimpl
def ckptstore_metadata_handlers() -> list[type[MetadataHandler]]:
    return [JsonCatalog]
