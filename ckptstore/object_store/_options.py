"""Settings every object store shares, resolved from keyword arguments (a URL's
``storage_options``), then environment variables, then defaults measured for object
stores.

A backend subclasses :class:`ObjectStoreOptions` (a frozen dataclass) with its own
fields, names its environment-variable prefix and the options it hands to its fsspec
filesystem untouched, and fills in what comes from its own environment variables.
Unknown option names are refused with the list of accepted ones.

Example::

    >>> from dataclasses import dataclass
    >>> import fsspec
    >>> @dataclass(frozen=True, repr=False)
    ... class MyOptions(ObjectStoreOptions):
    ...     STORE = "My"
    ...     DEFAULT_ENDPOINT = "https://my.example"
    ...     ENV_PREFIX = "CKPTSTORE_MY"
    ...     token: str | None = None
    ...     parts_threshold = 8 << 20
    ...     def open_filesystem(self, url): return fsspec.filesystem("memory")
    ...     def secrets(self): return (self.token,) if self.token else ()
    ...     @classmethod
    ...     def _with_environment(cls, given, env): return given
    >>> options = MyOptions.resolve({"part_size": 8 << 20}, env={"CKPTSTORE_MY_RETRIES": "3"})
    >>> options.part_size, options.retry.attempts
    (8388608, 4)
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar, Self

from ckptstore._environment import int_variable
from ckptstore.object_store._masking import mask
from ckptstore.object_store._retry import RetryPolicy

if TYPE_CHECKING:  # imported by the plugin's open_filesystem (not at registration)
    import fsspec

__all__ = ["ObjectStoreOptions"]

MiB = 1 << 20
DEFAULT_RETRIES = 7


@dataclass(frozen=True, repr=False)
class ObjectStoreOptions(ABC):
    """Resolved settings of one object-store checkpoint root.

    ``part_size``: bytes per part of a parallel upload; ``max_concurrency``: parts of one
    object in flight; ``buffer_bytes``: memory of one write stream; ``retry``: the retry
    policy of every request; ``passthrough``: options handed to the fsspec filesystem
    as they are.

    Example::

        >>> from ckptstore_s3 import S3Options
        >>> S3Options.resolve({"retries": 2}).retry.attempts
        3
    """

    STORE: ClassVar[str]
    """The store's name in messages (``"S3"``)."""
    DEFAULT_ENDPOINT: ClassVar[str]
    """The endpoint used without ``endpoint_url`` (in messages: ``"AWS S3"``)."""
    ENV_PREFIX: ClassVar[str]
    """Prefix of the ``<PREFIX>_RETRIES``, ``_PART_SIZE``, ``_MAX_CONCURRENCY`` variables."""
    PASSTHROUGH: ClassVar[frozenset[str]] = frozenset()
    """Options handed to the fsspec filesystem untouched."""
    RESOLVED: ClassVar[frozenset[str]] = frozenset({"retry", "passthrough"})
    """Fields :meth:`resolve` computes (not accepted as options)."""

    endpoint_url: str | None = None
    part_size: int = 16 * MiB
    max_concurrency: int = 16
    buffer_bytes: int = 256 * MiB
    connect_timeout: float = 10.0
    read_timeout: float = 60.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    passthrough: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        endpoint = self.endpoint_url
        if endpoint is not None and (not isinstance(endpoint, str) or "://" not in endpoint):
            raise ValueError(  # a CLI value such as -o endpoint_url=5 parses as a number
                f"endpoint_url must be a URL with its scheme (http://host:port), not {endpoint!r}"
            )
        if self.buffer_bytes < self.part_size:
            raise ValueError(
                f"buffer_bytes ({self.buffer_bytes}) must hold at least one part "
                f"({self.part_size}); raise buffer_bytes or lower part_size"
            )

    # -- what the path type reads -----------------------------------------------------

    @property
    @abstractmethod
    def parts_threshold(self) -> int:
        """Objects of at least this many bytes go up in parts, in parallel."""

    @property
    def endpoint(self) -> str:
        """Where requests go, for messages."""
        return self.endpoint_url or self.DEFAULT_ENDPOINT

    @property
    def stream_parts_in_flight(self) -> int:
        """Parts one write stream uploads at once: within ``max_concurrency`` and, with
        the part being filled, within ``buffer_bytes``."""
        return max(1, min(self.max_concurrency, self.buffer_bytes // self.part_size - 1))

    @abstractmethod
    def open_filesystem(self, url: str) -> tuple[fsspec.AbstractFileSystem, str]:
        """The fsspec filesystem these options describe, for ``url``, and the URL's root
        (``bucket/prefix``)."""

    # -- secrets ----------------------------------------------------------------------

    @abstractmethod
    def secrets(self) -> tuple[str, ...]:
        """Every credential value known to these options (to mask in messages)."""

    def mask(self, text: str) -> str:
        """``text`` with every credential value replaced by ``***``."""
        return mask(text, self.secrets())

    # -- resolving --------------------------------------------------------------------

    @classmethod
    def resolve(cls, options: Mapping[str, object], env: Mapping[str, str] | None = None) -> Self:
        """Options from keyword arguments first, then ``env`` (default: ``os.environ``).

        Unknown names raise :class:`TypeError` listing the accepted ones.
        """
        env = os.environ if env is None else env
        given = cls._normalise(dict(options))
        passthrough = {name: given.pop(name) for name in list(given) if name in cls.PASSTHROUGH}
        retries = given.pop("retries", None)
        if retries is None:
            retries = int_variable(env, f"{cls.ENV_PREFIX}_RETRIES")
            retries = DEFAULT_RETRIES if retries is None else retries
        retry = RetryPolicy(
            attempts=int(retries) + 1,
            base_delay=float(given.pop("retry_base_delay", 0.1)),
            max_delay=float(given.pop("retry_max_delay", 5.0)),
        )
        known = {f.name for f in fields(cls)} - cls.RESOLVED
        unknown = sorted(set(given) - known)
        if unknown:
            accepted = sorted(known | cls.PASSTHROUGH | {"retries", "retry_base_delay"})
            raise TypeError(
                f"unknown {cls.STORE} storage option(s) {unknown}; accepted: {', '.join(accepted)}"
            )
        values = cls._with_environment(given, env)
        for name in ("part_size", "max_concurrency"):
            variable = f"{cls.ENV_PREFIX}_{name.upper()}"
            if name not in values and env.get(variable):
                values[name] = int_variable(env, variable)
        return cls(**values, retry=retry, passthrough=passthrough)

    @classmethod
    def _normalise(cls, given: dict[str, Any]) -> dict[str, Any]:
        """The options under this class's own names (the default keeps them)."""
        return given

    @classmethod
    @abstractmethod
    def _with_environment(cls, given: dict[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
        """The field values: ``given`` completed from the store's environment variables."""
