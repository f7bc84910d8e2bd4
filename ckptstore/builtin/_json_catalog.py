"""The ``json`` metadata handler: a small catalog beside the checkpoints.

``<db_prefix>/_ckptstore/catalog.json`` lists every committed epoch with its nodes and
size. ``last_epoch`` answers from it with one read (no bucket listing), after checking
the chosen epoch's commit record is still there, so a job re-run with no arguments
resumes by itself from the newest epoch complete on every node.

Example::

    >>> from ckptstore import MultiNodeCheckpointManager
    >>> manager = MultiNodeCheckpointManager("ckpt", "zarr", metadata_handler="json")
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from ckptstore import protocol
from ckptstore._types import JSONObject
from ckptstore.errors import CheckpointNotFoundError, CorruptCheckpointError
from ckptstore.plugin._markers import hookimpl
from ckptstore.plugin._metadata import MetadataHandler
from ckptstore.protocol import require_commit
from ckptstore.records._documents import decode_document, encode_document, json_list, json_object
from ckptstore.records._layout import CONTROL_DIR, parse_commit_record_key

__all__ = ["CATALOG_KEY", "JsonCatalog"]

log = logging.getLogger(__name__)

CATALOG_KEY = f"{CONTROL_DIR}/catalog.json"
CATALOG_KIND = "ckptstore.catalog"


class JsonCatalog(MetadataHandler):
    """Committed epochs in a JSON document next to the checkpoints.

    ``last_epoch(user_epoch=N)`` checks that epoch ``N`` is committed on every node and
    returns it (the user's choice is never silently replaced); ``last_epoch()`` returns
    the newest complete epoch or ``None``.

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

    def epochs(self) -> dict[int, JSONObject]:
        """Every epoch in the catalog: ``{epoch: {"nodes": [...], "nbytes": ...}}``."""
        storage = self.require_storage()
        data = storage.get_document(CATALOG_KEY)
        if data is None:
            return {}
        try:
            document = decode_document(data, CATALOG_KIND, url=storage.display_url, key=CATALOG_KEY)
            entries = json_object(document, "epochs")
            return {int(epoch): json_object(entries, epoch) for epoch in entries}
        except (CorruptCheckpointError, KeyError, TypeError, ValueError, AttributeError) as error:
            log.warning("catalog %s is unreadable (%s); rebuilding it", CATALOG_KEY, error)
            return self._rebuild()

    def _rebuild(self) -> dict[int, dict[str, Any]]:
        """Recreate the catalog from the commit records (lists the control directory:
        a recovery path, never taken by a healthy save or resume)."""
        storage = self.require_storage()
        epochs: dict[int, dict[str, Any]] = {}
        for key in storage.list_keys(CONTROL_DIR):
            epoch = parse_commit_record_key(key)
            if epoch is None:
                continue
            try:
                record = protocol.read_commit(storage, epoch)
            except CorruptCheckpointError:
                continue
            if record is not None:
                epochs[epoch] = _entry(record)
        self._store(epochs)
        return epochs

    def _store(self, epochs: dict[int, dict[str, Any]]) -> None:
        body = {"epochs": {str(epoch): entry for epoch, entry in sorted(epochs.items())}}
        self.require_storage().put_document(CATALOG_KEY, encode_document(CATALOG_KIND, body))

    def last_epoch(self, user_epoch: int | None = None) -> int | None:
        storage = self.require_storage()
        nodes = set(self.node_names)
        if user_epoch is not None:
            committed = protocol.committed_nodes(storage, user_epoch)
            if not nodes <= committed:
                complete = sorted(
                    e
                    for e, entry in self.epochs().items()
                    if nodes.issubset(json_list(entry, "nodes"))
                )
                raise CheckpointNotFoundError(
                    storage.display_url,
                    None,
                    user_epoch,
                    f"cannot resume from epoch {user_epoch}: it is not committed for nodes "
                    f"{sorted(nodes - committed)} under {storage.display_url}. Complete epochs: "
                    f"{complete or 'none'}.",
                )
            return user_epoch
        for epoch, entry in sorted(self.epochs().items(), reverse=True):
            if not nodes.issubset(json_list(entry, "nodes")):
                continue
            try:
                committed = protocol.committed_nodes(storage, epoch)
            except CorruptCheckpointError as error:
                log.warning("skipping epoch %d: %s", epoch, error)
                continue
            if nodes <= committed:
                return epoch
        return None

    def forget(self, epochs: Sequence[int]) -> None:
        """Drop deleted ``epochs`` from the catalog (retention calls this)."""
        current = self.epochs()
        if any(epoch in current for epoch in epochs):
            self._store({e: entry for e, entry in current.items() if e not in set(epochs)})

    def write(self, epoch: int) -> None:
        record = require_commit(self.require_storage(), epoch, self.node_names, action="catalog")
        epochs = self.epochs()
        epochs[epoch] = _entry(record)
        self._store(epochs)


def _entry(record: protocol.EpochCommit) -> dict[str, Any]:
    return {
        "nodes": sorted(record.nodes),
        "nbytes": record.nbytes,
        "committed_at": record.committed_at,
        "db_types": sorted({node.db_type for node in record.nodes.values()}),
    }


@hookimpl
def ckptstore_metadata_handlers() -> list[type[MetadataHandler]]:
    return [JsonCatalog]
