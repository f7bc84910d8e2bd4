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
    problem_summary,
    verify_epochs,
)
from ckptstore.tools._dcp_layout import (
    METADATA_BLOB,
    METADATA_KIND,
    METADATA_NODE,
    DcpTensor,
    describe_dcp,
    metadata_bytes,
)
from ckptstore.tools._demo import DemoConfig, DemoResult, build_demo_job, run_demo
from ckptstore.tools._replication import (
    CONVERT_PASSES,
    NodeDone,
    convert_epochs,
    copy_epochs,
    copy_passes,
)

__all__ = [
    "CONVERT_PASSES",
    "METADATA_BLOB",
    "METADATA_KIND",
    "METADATA_NODE",
    "BlobDescription",
    "DcpTensor",
    "DemoConfig",
    "DemoResult",
    "EpochDescription",
    "NodeCheck",
    "NodeDescription",
    "NodeDone",
    "build_demo_job",
    "convert_epochs",
    "copy_epochs",
    "copy_passes",
    "describe_dcp",
    "describe_epoch",
    "metadata_bytes",
    "problem_summary",
    "run_demo",
    "verify_epochs",
]
