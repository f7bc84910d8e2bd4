"""The ``sqlite`` metadata handler: a catalog of runs, epochs and nodes in SQLite.

For teams keeping many runs in one place: one database file can catalog every run
(a run is a checkpoint root, named by its URL). Tables, all queryable with SQL::

    runs(run_id, url, db_type, created_at)
    epochs(run_id, epoch, committed_at, nbytes, stored_bytes, nnodes)
    nodes(run_id, epoch, node, db_type, nbytes, stored_bytes, nblobs, manifest_crc32c,
          save_duration_ns)
    events(event_id, run_id, at, action, node, epoch, duration_ns, nbytes, stored_bytes,
           error)                                  -- every reported save, load, failure

The database lives at ``database=``, else ``$CKPTSTORE_SQLITE_DATABASE``, else beside
local checkpoints (``<root>/_ckptstore/catalog.sqlite``); object-store roots need one
of the first two. ``last_epoch`` answers from the catalog and checks the chosen
epoch's commit record, so it never resumes from an epoch whose commit is gone.

Example::

    >>> from ckptstore import Job, JobRunner, LocalSession, Node, Task, epoch_limiter
    >>> with Job() as job, Node("trainer_0"):
    ...     with job.init_group:
    ...         _ = Task(lambda ws: ws.update(w=np.zeros(2)))
    ...     _ = Task(lambda ws: ws["w"].__iadd__(1))
    ...     done = epoch_limiter(job, 2)
    >>> from ckptstore import MultiNodeCheckpointManager
    >>> catalog = SqliteCatalog("ckpt-catalog.sqlite")  # a shared file, any checkpoint URL
    >>> manager = MultiNodeCheckpointManager("run-7", metadata_handler=catalog)
    >>> JobRunner(job, manager).train(LocalSession())
    2
    >>> catalog.query("SELECT epoch FROM epochs ORDER BY epoch")
    [(0,), (1,), (2,)]
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime

from ckptstore import protocol
from ckptstore._types import JSONObject
from ckptstore.errors import CheckpointNotFoundError, JobConfigurationError
from ckptstore.plugin._markers import hookimpl
from ckptstore.plugin._metadata import MetadataHandler
from ckptstore.protocol import require_commit
from ckptstore.records._documents import json_list
from ckptstore.records._layout import CONTROL_DIR
from ckptstore.records._stats import NodeStats

__all__ = ["DATABASE_ENV", "DEFAULT_NAME", "SqliteCatalog"]

DATABASE_ENV = "CKPTSTORE_SQLITE_DATABASE"
DEFAULT_NAME = "catalog.sqlite"
SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id INTEGER PRIMARY KEY,
    url TEXT NOT NULL UNIQUE,
    db_type TEXT,
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS epochs (
    run_id INTEGER NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
    epoch INTEGER NOT NULL,
    committed_at TEXT NOT NULL,
    nbytes INTEGER NOT NULL,
    stored_bytes INTEGER NOT NULL,
    nnodes INTEGER NOT NULL,
    PRIMARY KEY (run_id, epoch)
);
CREATE TABLE IF NOT EXISTS nodes (
    run_id INTEGER NOT NULL,
    epoch INTEGER NOT NULL,
    node TEXT NOT NULL,
    db_type TEXT NOT NULL,
    nbytes INTEGER NOT NULL,
    stored_bytes INTEGER NOT NULL,
    nblobs INTEGER NOT NULL,
    manifest_crc32c INTEGER NOT NULL,
    save_duration_ns INTEGER NOT NULL,
    PRIMARY KEY (run_id, epoch, node),
    FOREIGN KEY (run_id, epoch) REFERENCES epochs(run_id, epoch) ON DELETE CASCADE
);
CREATE TABLE IF NOT EXISTS events (
    event_id INTEGER PRIMARY KEY,
    run_id INTEGER NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
    at TEXT NOT NULL,
    action TEXT NOT NULL,
    node TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    duration_ns INTEGER NOT NULL,
    nbytes INTEGER NOT NULL,
    stored_bytes INTEGER NOT NULL,
    error TEXT
);
CREATE INDEX IF NOT EXISTS events_by_run ON events(run_id, action, epoch);
"""


class SqliteCatalog(MetadataHandler):
    """Committed epochs, nodes and every reported operation in an SQLite database.

    Example::

        >>> from ckptstore import MultiNodeCheckpointManager
        >>> catalog = SqliteCatalog()          # <root>/_ckptstore/catalog.sqlite
        >>> manager = MultiNodeCheckpointManager("ckpt", metadata_handler=catalog)
    """

    name = "sqlite"

    def __init__(self, database: str | os.PathLike[str] | None = None) -> None:
        super().__init__()
        self._database = os.fspath(database) if database is not None else None

    @property
    def database(self) -> str:
        """The database file's path (from ``database=``, the environment, or the root)."""
        configured = self._database or os.environ.get(DATABASE_ENV)
        if configured:
            return configured
        storage = self.require_storage()
        directory = storage.local_directory()
        if directory is None:
            raise JobConfigurationError(
                f"the sqlite catalog cannot live in {storage.display_url}: give it a local "
                f"file, SqliteCatalog(database='/path/catalog.sqlite') or ${DATABASE_ENV}"
            )
        return os.path.join(directory, CONTROL_DIR, DEFAULT_NAME)

    @property
    def run_url(self) -> str:
        """The run this handler catalogs: its checkpoint root's URL."""
        return self.require_storage().display_url

    @contextlib.contextmanager
    def connect(self) -> Iterator[sqlite3.Connection]:
        """A connection in a transaction (committed on success), schema created."""
        path = self.database
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        connection = sqlite3.connect(path, timeout=30)
        try:
            connection.execute("PRAGMA foreign_keys = ON")
            if connection.execute("PRAGMA user_version").fetchone()[0] != SCHEMA_VERSION:
                connection.executescript(_SCHEMA)
                connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            with connection:
                yield connection
        finally:
            connection.close()

    def query(self, sql: str, parameters: Sequence[object] = ()) -> list[tuple[object, ...]]:
        """Run a read query against the catalog; rows as tuples."""
        with self.connect() as connection:
            return list(connection.execute(sql, parameters))

    def _run_id(self, connection: sqlite3.Connection) -> int:
        url = self.run_url
        connection.execute(
            "INSERT OR IGNORE INTO runs (url, db_type, created_at) VALUES (?, ?, ?)",
            (url, self.db_type, _now()),
        )
        row = connection.execute("SELECT run_id FROM runs WHERE url = ?", (url,)).fetchone()
        return int(row[0])

    # -- queries ----------------------------------------------------------------------

    def epochs(self) -> dict[int, JSONObject]:
        """This run's cataloged epochs: ``{epoch: {"nodes": [...], "nbytes": ...}}``."""
        with self.connect() as connection:
            run_id = self._run_id(connection)
            rows = connection.execute(
                "SELECT e.epoch, e.committed_at, e.nbytes, e.stored_bytes, "
                "group_concat(n.node, char(10)) FROM epochs e JOIN nodes n "
                "ON n.run_id = e.run_id AND n.epoch = e.epoch WHERE e.run_id = ? "
                "GROUP BY e.epoch ORDER BY e.epoch",
                (run_id,),
            ).fetchall()
        return {
            int(epoch): {
                "committed_at": committed_at,
                "nbytes": int(nbytes),
                "stored_bytes": int(stored),
                "nodes": sorted(str(nodes).split("\n")),
            }
            for epoch, committed_at, nbytes, stored, nodes in rows
        }

    def runs(self) -> list[str]:
        """The URL of every run in the database."""
        with self.connect() as connection:
            return [row[0] for row in connection.execute("SELECT url FROM runs ORDER BY url")]

    # -- the handler contract ---------------------------------------------------------

    def last_epoch(self, user_epoch: int | None = None) -> int | None:
        storage = self.require_storage()
        nodes = set(self.node_names)
        if user_epoch is not None:
            committed = protocol.committed_nodes(storage, user_epoch)
            if not nodes <= committed:
                raise CheckpointNotFoundError(
                    storage.display_url,
                    None,
                    user_epoch,
                    f"cannot resume from epoch {user_epoch}: it is not committed for nodes "
                    f"{sorted(nodes - committed)} under {storage.display_url}. Complete "
                    f"epochs: {self._complete(nodes) or 'none'}.",
                )
            return user_epoch
        for epoch in reversed(self._complete(nodes)):
            if nodes <= protocol.committed_nodes(storage, epoch):
                return epoch
        return None

    def _complete(self, nodes: set[str]) -> list[int]:
        return [
            epoch
            for epoch, entry in self.epochs().items()
            if nodes.issubset(json_list(entry, "nodes"))
        ]

    def write(self, epoch: int) -> None:
        record = require_commit(self.require_storage(), epoch, self.node_names, action="catalog")
        with self.connect() as connection:
            run_id = self._run_id(connection)
            connection.execute("DELETE FROM epochs WHERE run_id = ? AND epoch = ?", (run_id, epoch))
            connection.execute(
                "INSERT INTO epochs VALUES (?, ?, ?, ?, ?, ?)",
                (
                    run_id,
                    epoch,
                    record.committed_at,
                    record.nbytes,
                    sum(node.stored_bytes for node in record.nodes.values()),
                    len(record.nodes),
                ),
            )
            connection.executemany(
                "INSERT INTO nodes VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        run_id,
                        epoch,
                        name,
                        node.db_type,
                        node.nbytes,
                        node.stored_bytes,
                        node.nblobs,
                        node.manifest_crc32c,
                        node.duration_ns,
                    )
                    for name, node in sorted(record.nodes.items())
                ],
            )

    def report(self, action_name: str, stats: Mapping[str, NodeStats]) -> None:
        if not stats:
            return
        with self.connect() as connection:
            run_id = self._run_id(connection)
            connection.executemany(
                "INSERT INTO events (run_id, at, action, node, epoch, duration_ns, nbytes, "
                "stored_bytes, error) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        run_id,
                        _now(),
                        action_name,
                        node.node,
                        node.epoch,
                        node.duration_ns,
                        node.nbytes,
                        node.stored_bytes,
                        node.error,
                    )
                    for node in stats.values()
                ],
            )

    def forget(self, epochs: Sequence[int]) -> None:
        """Drop deleted epochs (and their nodes) from the catalog; events are kept."""
        with self.connect() as connection:
            run_id = self._run_id(connection)
            connection.executemany(
                "DELETE FROM epochs WHERE run_id = ? AND epoch = ?",
                [(run_id, epoch) for epoch in epochs],
            )


def _now() -> str:
    return datetime.now(UTC).isoformat()


@hookimpl
def ckptstore_metadata_handlers() -> list[type[MetadataHandler]]:
    return [SqliteCatalog]
