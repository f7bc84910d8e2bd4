"""S3 options: from keyword arguments (a URL's ``storage_options``), then the usual
environment variables, then defaults measured for object stores.

=====================  ==========================================  =====================
option                 environment variable                        default
=====================  ==========================================  =====================
``endpoint_url``       ``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``  AWS
``region``             ``AWS_REGION``, ``AWS_DEFAULT_REGION``       botocore's choice
``profile``            ``AWS_PROFILE``                             botocore's chain
``key`` / ``secret``   ``AWS_ACCESS_KEY_ID`` / ``_SECRET_ACCESS_KEY``  botocore's chain
``token``              ``AWS_SESSION_TOKEN``                       none
``part_size``          ``CKPTSTORE_S3_PART_SIZE``                  16 MiB
``max_concurrency``    ``CKPTSTORE_S3_MAX_CONCURRENCY``            16 parts per object
``retries``            ``CKPTSTORE_S3_RETRIES``                    7 (8 attempts)
=====================  ==========================================  =====================

Credentials are kept out of ``repr`` and of every message; :meth:`S3Options.mask`
removes them from any text.

Example::

    >>> options = S3Options.resolve({"endpoint_url": "http://127.0.0.1:5000", "key": "k1d",
    ...                              "secret": "s3cr3t", "part_size": 8 << 20})
    >>> "k1d" in repr(options) or "s3cr3t" in repr(options)
    False
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ckptstore.object_store import ObjectStoreOptions
from ckptstore_s3.redaction import protect
from ckptstore_s3.sessions import shared_session

__all__ = ["MIN_PART_SIZE", "S3Options"]

MiB = 1 << 20
MIN_PART_SIZE = 5 * MiB
"""S3 refuses multipart parts smaller than this (except the last)."""
_MAX_PART_SIZE = 5 << 30

_S3FS_PASSTHROUGH = frozenset(
    {
        "use_ssl",
        "requester_pays",
        "s3_additional_kwargs",
        "version_aware",
        "cache_regions",
        "default_block_size",
        "fixed_upload_size",
        "session",
    }
)
_ALIASES = {
    "region_name": "region",
    "aws_access_key_id": "key",
    "aws_secret_access_key": "secret",
    "aws_session_token": "token",
    "username": "key",
    "password": "secret",
}


@dataclass(frozen=True, repr=False)
class S3Options(ObjectStoreOptions):
    """Resolved settings of one S3 checkpoint root (the shared ones are
    :class:`~ckptstore.object_store.ObjectStoreOptions`'s).

    Example::

        >>> S3Options.resolve({}, env={"AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9000"}).endpoint_url
        'http://127.0.0.1:9000'
    """

    STORE = "S3"
    DEFAULT_ENDPOINT = "AWS S3"
    ENV_PREFIX = "CKPTSTORE_S3"
    PASSTHROUGH = _S3FS_PASSTHROUGH
    RESOLVED = ObjectStoreOptions.RESOLVED | {"env_secrets"}

    region: str | None = None
    profile: str | None = None
    key: str | None = None
    secret: str | None = None
    token: str | None = None
    anon: bool = False
    multipart_threshold: int = 64 * MiB
    max_connections: int = 128
    client_kwargs: Mapping[str, Any] = field(default_factory=dict)
    config_kwargs: Mapping[str, Any] = field(default_factory=dict)
    env_secrets: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not MIN_PART_SIZE <= self.part_size <= _MAX_PART_SIZE:
            raise ValueError(
                f"part_size must be between 5 MiB and 5 GiB (S3's limits), got {self.part_size}"
            )
        if self.max_concurrency < 1 or self.max_connections < 1:
            raise ValueError("max_concurrency and max_connections must be at least 1")
        super().__post_init__()

    @property
    def parts_threshold(self) -> int:
        return self.multipart_threshold

    @classmethod
    def _normalise(cls, given: dict[str, Any]) -> dict[str, Any]:
        """boto3's and s3fs's names under ours; endpoint and region out of
        ``client_kwargs``."""
        given = {_ALIASES.get(name, name): value for name, value in given.items()}
        client_kwargs = dict(given.pop("client_kwargs", None) or {})
        for name, target in (("endpoint_url", "endpoint_url"), ("region_name", "region")):
            if name in client_kwargs and target not in given:
                given[target] = client_kwargs.pop(name)
        given["client_kwargs"] = client_kwargs
        return given

    @classmethod
    def _with_environment(cls, given: dict[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
        values: dict[str, Any] = dict(given)
        values.setdefault(
            "endpoint_url", env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None
        )
        values.setdefault("region", env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None)
        values.setdefault("profile", env.get("AWS_PROFILE") or None)
        for name in ("part_size", "multipart_threshold", "max_concurrency", "max_connections"):
            if name in values:
                values[name] = int(values[name])
        values["env_secrets"] = tuple(
            value
            for value in (
                env.get("AWS_ACCESS_KEY_ID"),
                env.get("AWS_SECRET_ACCESS_KEY"),
                env.get("AWS_SESSION_TOKEN"),
            )
            if value
        )
        return values

    # -- secrets ----------------------------------------------------------------------

    def secrets(self) -> tuple[str, ...]:
        """Every credential value known to these options (to mask in messages)."""
        explicit = tuple(value for value in (self.key, self.secret, self.token) if value)
        return explicit + self.env_secrets

    def __repr__(self) -> str:
        credentials = (
            "anonymous"
            if self.anon
            else "explicit"
            if self.key or self.secret
            else f"profile {self.profile!r}"
            if self.profile
            else "default chain"
        )
        return (
            f"S3Options(endpoint_url={self.endpoint_url!r}, region={self.region!r}, "
            f"credentials={credentials}, part_size={self.part_size}, "
            f"max_concurrency={self.max_concurrency}, retries={self.retry.attempts - 1})"
        )

    # -- s3fs -------------------------------------------------------------------------

    def open_filesystem(self, url: str) -> tuple[Any, str]:
        """An s3fs filesystem (credentials masked in botocore's logs from now on)."""
        from fsspec.core import url_to_fs  # imported here: s3fs comes with the filesystem

        protect(self.secrets())
        fs, root = url_to_fs(url, **self.s3fs_kwargs())
        return fs, str(root)

    def s3fs_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for :class:`s3fs.S3FileSystem` (requests untouched by
        botocore's own retries: :mod:`ckptstore.object_store._retry` retries them)."""
        config: dict[str, Any] = {
            "max_pool_connections": self.max_connections,
            "connect_timeout": self.connect_timeout,
            "read_timeout": self.read_timeout,
            "retries": {"total_max_attempts": 1},
            "request_checksum_calculation": "when_required",
            "response_checksum_validation": "when_required",
            "s3": {"payload_signing_enabled": False},
        }
        config.update(self.config_kwargs)
        client_kwargs = dict(self.client_kwargs)
        if self.region:
            client_kwargs["region_name"] = self.region
        kwargs: dict[str, Any] = {
            "anon": self.anon,
            "endpoint_url": self.endpoint_url,
            "key": self.key,
            "secret": self.secret,
            "token": self.token,
            "client_kwargs": client_kwargs,
            "config_kwargs": config,
            "skip_instance_cache": True,
            "max_concurrency": self.max_concurrency,
            "session": shared_session(self.profile or None),
            **self.passthrough,
        }
        if self.profile:
            kwargs["profile"] = self.profile
        return kwargs
