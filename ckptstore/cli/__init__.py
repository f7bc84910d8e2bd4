"""The ``ckptstore`` command line: the demo job and the operator tools.

The top layer: a thin shell over :mod:`ckptstore.tools` and the checkpoint API that turns
user errors into one-line messages and documented exit codes (``docs/cli.md``).
"""

from ckptstore.cli._main import main

__all__ = ["main"]
