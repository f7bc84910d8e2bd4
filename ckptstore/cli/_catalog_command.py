"""``ckptstore catalog rebuild URL [--kind json|sqlite] [--database FILE]``: recreate a
run's catalog from its commit records (the truth; the catalog is an index)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from ckptstore.builtin import (
    CATALOG_DIR,
    DATABASE_ENV,
    DEFAULT_NAME,
    LEGACY_CATALOG_KEY,
    IndexCatalog,
    JsonCatalog,
    SqliteCatalog,
)
from ckptstore.cli import _common as common
from ckptstore.plugin import PathType
from ckptstore.records import CONTROL_DIR


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "catalog",
        help="maintain a run's catalog (an index of its commit records)",
        description="Catalogs (the json and sqlite metadata handlers) are indexes of the "
        "commit records, which decide what is committed. Jobs repair a damaged or stale "
        "catalog by themselves; these verbs do it on demand.",
    )
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    common.add_command(
        verbs,
        "rebuild",
        run,
        summary="recreate the catalog from the commit records",
        description="Make the catalog of URL list exactly the epochs committed in storage "
        "(lists the control directory, reads every commit record). An unreadable catalog "
        "is discarded (an sqlite file is moved aside, never deleted). --kind auto rebuilds "
        "every catalog the root has (json when it has none).",
        arguments=_arguments,
        progress=False,
    )


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kind",
        choices=("auto", "json", "sqlite"),
        default="auto",
        help="which catalog to rebuild (default: those the root has, else json)",
    )
    parser.add_argument(
        "--database",
        metavar="FILE",
        help=f"the sqlite catalog's file (default: ${DATABASE_ENV}, else "
        f"<root>/{CONTROL_DIR}/{DEFAULT_NAME})",
    )


@common.guarded
def run(args: argparse.Namespace) -> int:
    storage = common.open_storage(args.url, args)
    if not common.location_exists(storage):
        return common.nothing_at(storage, args)
    reports = []
    for catalog in _catalogs(storage, args):
        catalog.set_params(storage.display_url, "", [], storage=storage)
        reports.append((catalog.name, catalog.rebuild()))
    if args.json:
        common.print_json(
            {
                "url": storage.display_url,
                "catalogs": [{"kind": kind, **report.to_json()} for kind, report in reports],
            }
        )
        return common.EXIT_OK
    for kind, report in reports:
        print(f"{kind}: {report.describe()}")
    return common.EXIT_OK


def _catalogs(storage: PathType, args: argparse.Namespace) -> list[IndexCatalog]:
    if args.kind == "json":
        return [JsonCatalog()]
    if args.kind == "sqlite":
        return [SqliteCatalog(args.database)]
    found: list[IndexCatalog] = []
    if storage.list_keys(CATALOG_DIR) or storage.exists(LEGACY_CATALOG_KEY):
        found.append(JsonCatalog())
    directory = storage.local_directory()
    beside = directory is not None and os.path.exists(
        os.path.join(directory, CONTROL_DIR, DEFAULT_NAME)
    )
    if args.database or os.environ.get(DATABASE_ENV) or beside:
        found.append(SqliteCatalog(args.database))
    return found or [JsonCatalog()]
