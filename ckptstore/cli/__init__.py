"""The ``ckptstore`` command line: the demo job and the operator tools."""
