"""Tuning knobs of the I/O engine."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ckptstore._environment import int_variable
from ckptstore.errors import JobConfigurationError

__all__ = ["IOSettings", "usable_cpus"]

MiB = 1 << 20


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, not the machine's count)."""
    return len(os.sched_getaffinity(0))


@dataclass(frozen=True)
class IOSettings:
    """How a save or load cuts blobs into chunks and how many it moves at once.

    * ``chunk_bytes``: target size of one chunk; large blobs are cut into chunks of
      about this size, smaller blobs are never split.
    * ``concurrency``: chunks read or written at the same time.
    * ``memory_budget``: most bytes held in flight at once (copies, downloads,
      compression buffers) above the live state, whatever the checkpoint's size.
    * ``verify``: check every chunk's checksum (CRC-32) on load.

    Each path type brings defaults measured for it (local disk, object store); a
    manager's ``io=`` or the ``CKPTSTORE_IO_*`` environment variables override them.
    Settings that cannot work (a chunk under 4096 bytes, no concurrency, a budget under
    one chunk) raise :class:`~ckptstore.errors.JobConfigurationError` (a ``ValueError``).

    Example::

        >>> from ckptstore import CheckpointManager
        >>> settings = IOSettings(concurrency=8, chunk_bytes=32 << 20)
        >>> manager = CheckpointManager("ckpt", "trainer_0", "zarr", io=settings)
        >>> settings.merged(concurrency=2).concurrency
        2
    """

    chunk_bytes: int = 16 * MiB
    concurrency: int = 4
    memory_budget: int = 256 * MiB
    verify: bool = True

    def __post_init__(self) -> None:
        if self.chunk_bytes < 4096:
            raise JobConfigurationError(
                f"chunk_bytes must be at least 4096, got {self.chunk_bytes}; pass a larger "
                "chunk_bytes (or CKPTSTORE_IO_CHUNK_BYTES), or leave it to the default"
            )
        if self.concurrency < 1:
            raise JobConfigurationError(
                f"concurrency must be at least 1, got {self.concurrency}; pass 1 or more "
                "(or CKPTSTORE_IO_CONCURRENCY), or leave it to the default"
            )
        if self.memory_budget < self.chunk_bytes:
            raise JobConfigurationError(
                f"memory_budget ({self.memory_budget}) must hold at least one chunk "
                f"({self.chunk_bytes}); raise memory_budget (or CKPTSTORE_IO_MEMORY_BUDGET) "
                "or lower chunk_bytes (or CKPTSTORE_IO_CHUNK_BYTES) to at most the budget"
            )

    def merged(
        self,
        *,
        chunk_bytes: int | None = None,
        concurrency: int | None = None,
        memory_budget: int | None = None,
        verify: bool | None = None,
    ) -> IOSettings:
        """A copy with the non-None overrides applied."""
        return IOSettings(
            self.chunk_bytes if chunk_bytes is None else chunk_bytes,
            self.concurrency if concurrency is None else concurrency,
            self.memory_budget if memory_budget is None else memory_budget,
            self.verify if verify is None else verify,
        )

    def with_environment(self) -> IOSettings:
        """A copy with ``CKPTSTORE_IO_CHUNK_BYTES`` / ``_CONCURRENCY`` / ``_MEMORY_BUDGET``
        / ``_VERIFY`` applied when set."""
        env = os.environ
        verify = env.get("CKPTSTORE_IO_VERIFY")
        return self.merged(
            chunk_bytes=int_variable(env, "CKPTSTORE_IO_CHUNK_BYTES"),
            concurrency=int_variable(env, "CKPTSTORE_IO_CONCURRENCY"),
            memory_budget=int_variable(env, "CKPTSTORE_IO_MEMORY_BUDGET"),
            verify=verify.lower() not in ("0", "false", "no", "off") if verify else None,
        )
