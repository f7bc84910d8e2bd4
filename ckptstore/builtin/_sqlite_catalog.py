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
of the first two. The catalog is an index of the commit records (see
:mod:`ckptstore.builtin._catalog`): ``last_epoch`` answers from storage, and a
missing, unreadable (even zero-filled) or stale database is rebuilt from them. Every
change is one ``BEGIN IMMEDIATE`` transaction with a busy timeout, so concurrent jobs
never lose each other's entries.

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
import errno
import logging
import os
import sqlite3
import stat
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime

from ckptstore.builtin._catalog import CatalogEntry, IndexCatalog
from ckptstore.errors import (
    CatalogCorruptError,
    CkptStoreError,
    CorruptCheckpointError,
    JobConfigurationError,
    StorageError,
    storage_error,
)
from ckptstore.plugin import MetadataHandler, hookimpl
from ckptstore.protocol import EpochCommit
from ckptstore.records import CONTROL_DIR, NodeStats

__all__ = ["BUSY_TIMEOUT_S", "DATABASE_ENV", "DEFAULT_NAME", "SqliteCatalog"]

log = logging.getLogger(__name__)

DATABASE_ENV = "CKPTSTORE_SQLITE_DATABASE"
DEFAULT_NAME = "catalog.sqlite"
BUSY_TIMEOUT_S = 60.0
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


class SqliteCatalog(IndexCatalog):
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
        """A connection in one ``BEGIN IMMEDIATE`` transaction (committed on success,
        rolled back on error), schema created. SQLite errors come out typed:
        :class:`CatalogCorruptError` for a file that is not a database, else
        :class:`StorageError`."""
        path = self.database
        try:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            if not (self._database or os.environ.get(DATABASE_ENV)):
                self._refuse_links(path)
            connection = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        except (OSError, sqlite3.Error) as error:
            raise StorageError(path, None, "open the sqlite catalog", error) from error
        try:
            with self._typed_errors(path), _storage_errors(path):
                connection.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
                connection.execute("PRAGMA trusted_schema = OFF")  # the file is stored data
                connection.execute("PRAGMA foreign_keys = ON")
                connection.execute("BEGIN IMMEDIATE")
                try:
                    if connection.execute("PRAGMA user_version").fetchone()[0] != SCHEMA_VERSION:
                        for statement in _SCHEMA.split(";"):
                            if statement.strip():
                                connection.execute(statement)
                        connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                    yield connection
                except BaseException:
                    with contextlib.suppress(sqlite3.Error):
                        connection.execute("ROLLBACK")
                    raise
                connection.execute("COMMIT")
        finally:
            connection.close()

    @contextlib.contextmanager
    def _typed_errors(self, path: str) -> Iterator[None]:
        """SQLite's errors as ckptstore's: a damaged file is a corrupt catalog (rebuilt
        by the caller, or by the CLI command its message quotes), anything else (locked
        past the busy timeout, I/O) a storage error."""
        try:
            yield
        except sqlite3.OperationalError as error:
            raise StorageError(path, None, "use the sqlite catalog", error) from error
        except sqlite3.DatabaseError as error:
            root = self.storage.display_url if self.storage is not None else "URL"
            rebuild = (root, "--kind", "sqlite", "--database", path)
            raise CatalogCorruptError(str(error), url=path, rebuild=rebuild) from error

    def _refuse_links(self, path: str) -> None:
        """The catalog inside the checkpoint root is stored data: refuse it if a link
        (symbolic, or a hard link shared with another file) would send SQLite's writes
        outside the root (see docs/security.md)."""
        directory = self.require_storage().local_directory() or ""
        expected = os.path.join(os.path.realpath(directory), CONTROL_DIR, DEFAULT_NAME)
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            info = None
        if os.path.realpath(path) != expected or (
            info is not None and (not stat.S_ISREG(info.st_mode) or info.st_nlink > 1)
        ):
            if os.path.realpath(os.path.dirname(path)) == os.path.dirname(expected):
                # the file itself is the link: an unreadable catalog, which the caller
                # moves aside (the link, never its target) and rebuilds from storage
                raise CatalogCorruptError(
                    "the catalog database is reached through a link; ckptstore never "
                    "follows links inside a checkpoint",
                    url=self.require_storage().display_url,
                    file=f"{CONTROL_DIR}/{DEFAULT_NAME}",
                )
            raise CorruptCheckpointError(
                "the catalog database is reached through a link; ckptstore never follows "
                "links inside a checkpoint",
                url=self.require_storage().display_url,
                file=f"{CONTROL_DIR}/{DEFAULT_NAME}",
            )

    def query(self, sql: str, parameters: Sequence[object] = ()) -> list[tuple[object, ...]]:
        """Run a read query against the catalog; rows as tuples."""
        with self.connect() as connection, self._typed_errors(self.database):
            return list(connection.execute(sql, parameters))

    def _run_id(self, connection: sqlite3.Connection) -> int:
        url = self.run_url
        connection.execute(
            "INSERT OR IGNORE INTO runs (url, db_type, created_at) VALUES (?, ?, ?)",
            (url, self.db_type, _now()),
        )
        row = connection.execute("SELECT run_id FROM runs WHERE url = ?", (url,)).fetchone()
        return int(row[0])

    def runs(self) -> list[str]:
        """The URL of every run in the database."""
        with self.connect() as connection:
            return [row[0] for row in connection.execute("SELECT url FROM runs ORDER BY url")]

    # -- storage of the catalog -------------------------------------------------------

    def _read_entries(self) -> dict[int, CatalogEntry]:
        with self.connect() as connection:
            run_id = self._run_id(connection)
            rows = connection.execute(
                "SELECT e.epoch, e.committed_at, e.nbytes, e.stored_bytes, "
                "group_concat(n.node, char(10)), group_concat(n.db_type, char(10)) "
                "FROM epochs e JOIN nodes n ON n.run_id = e.run_id AND n.epoch = e.epoch "
                "WHERE e.run_id = ? GROUP BY e.epoch ORDER BY e.epoch",
                (run_id,),
            ).fetchall()
        return {
            int(epoch): CatalogEntry(
                epoch=int(epoch),
                nodes=tuple(sorted(str(nodes).split("\n"))),
                nbytes=int(nbytes),
                stored_bytes=int(stored),
                committed_at=str(committed_at),
                db_types=tuple(sorted(set(str(db_types).split("\n")))),
            )
            for epoch, committed_at, nbytes, stored, nodes, db_types in rows
        }

    def _put_entry(self, record: EpochCommit) -> None:
        entry = CatalogEntry.from_commit(record)
        with self.connect() as connection:
            run_id = self._run_id(connection)
            connection.execute(
                "DELETE FROM epochs WHERE run_id = ? AND epoch = ?", (run_id, entry.epoch)
            )
            connection.execute(
                "INSERT INTO epochs VALUES (?, ?, ?, ?, ?, ?)",
                (
                    run_id,
                    entry.epoch,
                    entry.committed_at,
                    entry.nbytes,
                    entry.stored_bytes,
                    len(entry.nodes),
                ),
            )
            connection.executemany(
                "INSERT INTO nodes VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        run_id,
                        entry.epoch,
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

    def _drop_entries(self, epochs: Sequence[int]) -> None:
        with self.connect() as connection:
            run_id = self._run_id(connection)
            connection.executemany(
                "DELETE FROM epochs WHERE run_id = ? AND epoch = ?",
                [(run_id, epoch) for epoch in epochs],
            )

    def _reset(self) -> None:
        path = self.database
        aside = f"{path}.unreadable-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S%f')}"
        for suffix in ("", "-journal", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.replace(path + suffix, aside + suffix)
        log.warning("moved the unreadable sqlite catalog %s aside to %s", path, aside)

    # -- events -----------------------------------------------------------------------

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


# SQLite's primary result codes that are storage failures, as the errno they report
_SQLITE_ERRNOS = {
    13: errno.ENOSPC,  # SQLITE_FULL
    10: errno.EIO,  # SQLITE_IOERR (extended codes keep it in the low byte)
    8: errno.EROFS,  # SQLITE_READONLY
    3: errno.EACCES,  # SQLITE_PERM
    14: errno.EACCES,  # SQLITE_CANTOPEN
}


@contextlib.contextmanager
def _storage_errors(path: str) -> Iterator[None]:
    """Raise the catalog file's storage failures (a full disk, an I/O error, a read-only
    file) as the typed :class:`~ckptstore.errors.StorageError` they are; other
    ``sqlite3`` errors pass unchanged."""
    try:
        yield
    except CkptStoreError:
        raise
    except OSError as error:
        raise storage_error(
            os.path.dirname(path), os.path.basename(path), "write", error
        ) from error
    except sqlite3.Error as error:
        code = _SQLITE_ERRNOS.get(getattr(error, "sqlite_errorcode", 0) & 0xFF)
        if code is None:
            raise
        cause = OSError(code, f"{os.strerror(code)} (sqlite: {error})", path)
        raise storage_error(
            os.path.dirname(path), os.path.basename(path), "write", cause
        ) from error


def _now() -> str:
    return datetime.now(UTC).isoformat()


@hookimpl
def ckptstore_metadata_handlers() -> list[type[MetadataHandler]]:
    return [SqliteCatalog]
