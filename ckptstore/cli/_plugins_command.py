"""``ckptstore plugins``: what installed plugins provide, and which are broken and why."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Any

from ckptstore.plugin import get_registry


def register(commands: Any) -> None:
    parser = commands.add_parser("plugins", help="list installed plugins and what they provide")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    infos = get_registry().plugins()
    if args.json:
        print(json.dumps([asdict(info) for info in infos], indent=2))
        return 0
    for info in infos:
        origin = info.distribution or "built in"
        print(f"{info.name}  [{origin}]")
        if info.error is not None:
            print(f"    broken, left out: {info.error}")
            print(f"    (fix or reinstall it, or set CKPTSTORE_DISABLE_PLUGINS={info.name})")
        for label, names in (
            ("db types", info.db_types),
            ("path types", info.path_types),
            ("metadata handlers", info.metadata_handlers),
            ("upload builders", info.upload_builders),
        ):
            if names:
                print(f"    {label}: {', '.join(names)}")
        if info.reports:
            print("    reports: ckptstore_report")
    return 0
