"""``ckptstore demo``: the demo training job."""

from __future__ import annotations

import argparse
from typing import Any

from ckptstore.cli._common import committed
from ckptstore.cli._main import EXIT_ERROR, EXIT_OK
from ckptstore.cli._output import fail
from ckptstore.cli._parser import at_least
from ckptstore.paths import LocalPath
from ckptstore.tools import DemoConfig, run_demo


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "demo",
        help="train a small model on several nodes, checkpointing every epoch",
        description="Train one-vs-rest logistic regression on synthetic data (one class per "
        "node, under LocalSession), checkpointing every epoch. Run it again and it resumes "
        "from the last complete epoch.",
    )
    parser.add_argument("--dir", default="./ckptstore-demo", help="checkpoint directory")
    parser.add_argument("--epochs", type=at_least(1), default=6, help="train up to this epoch")
    parser.add_argument(
        "--nodes", type=at_least(2), default=3, help="number of nodes (classes), at least 2"
    )
    parser.add_argument("--db-type", default="zarr", help="checkpoint format (zarr, npz...)")
    parser.add_argument("--fresh", action="store_true", help="delete old checkpoints first")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    config = DemoConfig(
        directory=args.dir,
        epochs=args.epochs,
        nodes=args.nodes,
        db_type=args.db_type,
        fresh=args.fresh,
    )
    result = run_demo(config)
    if result is None:
        return EXIT_OK
    epochs = committed(LocalPath(config.directory))
    if not epochs or epochs[-1] < result.last_epoch:
        newest = f"epoch {epochs[-1]}" if epochs else "none"
        return fail(
            f"trained to epoch {result.last_epoch} but the newest checkpoint in "
            f"{config.directory} is {newest}: saving failed (see above); use a writable "
            "--dir with free space",
            EXIT_ERROR,
            json_mode=False,
            kind="SaveFailedError",
        )
    return EXIT_OK
