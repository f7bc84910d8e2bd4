"""Operator tools over stored checkpoints: verify, describe, copy and convert epochs, and
the demo training job. The CLI is a thin shell over these.

May import every layer below the CLI (checkpoint, protocol, plugin, records, io).

Example::

    >>> import io
    >>> from ckptstore.tools import DemoConfig, run_demo
    >>> progress = io.StringIO()  # where the progress lines go (default: stdout)
    >>> run_demo(DemoConfig(directory="./ckptstore-demo", epochs=2, nodes=2), progress).last_epoch
    2
"""

from ckptstore.tools._checking import (
    BlobDescription,
    EpochDescription,
    NodeCheck,
    NodeDescription,
    describe_epoch,
    verify_epochs,
)
from ckptstore.tools._demo import DemoConfig, DemoResult, build_demo_job, run_demo
from ckptstore.tools._replication import NodeDone, convert_epochs, copy_epochs

__all__ = [
    "BlobDescription",
    "DemoConfig",
    "DemoResult",
    "EpochDescription",
    "NodeCheck",
    "NodeDescription",
    "NodeDone",
    "build_demo_job",
    "convert_epochs",
    "copy_epochs",
    "describe_epoch",
    "run_demo",
    "verify_epochs",
]
