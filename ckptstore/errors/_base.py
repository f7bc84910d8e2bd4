"""The root of every ckptstore error."""

from __future__ import annotations


class CkptStoreError(Exception):
    """Root of every ckptstore error.

    Example::

        >>> from ckptstore.records import validate_blob_name
        >>> try:
        ...     validate_blob_name("../escape")
        ... except CkptStoreError as err:
        ...     print("checkpointing failed:", type(err).__name__)
        checkpointing failed: InvalidNameError
    """

    def __str__(self) -> str:
        # KeyError quotes its argument; every ckptstore error prints its message as is.
        return str(self.args[0]) if self.args else self.__class__.__name__
