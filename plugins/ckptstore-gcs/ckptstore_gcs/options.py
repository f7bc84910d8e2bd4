"""GCS options: from keyword arguments (a URL's ``storage_options``), then the usual
environment variables, then defaults measured for object stores.

=====================  =====================================  ==========================
option                 environment variable                   default
=====================  =====================================  ==========================
``endpoint_url``       ``STORAGE_EMULATOR_HOST``              storage.googleapis.com
``project``            ``GOOGLE_CLOUD_PROJECT``, ``GCLOUD_PROJECT``  from the credentials
``token``              ``GOOGLE_APPLICATION_CREDENTIALS``     google-auth's default
                                                              (``"anon"`` for emulators)
``part_size``          ``CKPTSTORE_GCS_PART_SIZE``            16 MiB
``max_concurrency``    ``CKPTSTORE_GCS_MAX_CONCURRENCY``      16 parts per object
``retries``            ``CKPTSTORE_GCS_RETRIES``              7 (8 attempts)
=====================  =====================================  ==========================

Example::

    GCSOptions.resolve({"endpoint_url": "http://127.0.0.1:9023", "token": "anon"})
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from ckptstore_gcs.retry import RetryPolicy, mask

__all__ = ["GCSOptions"]

MiB = 1 << 20
DEFAULT_ENDPOINT = "https://storage.googleapis.com"
_MIN_PART_SIZE = 256 << 10
_GCSFS_PASSTHROUGH = frozenset(
    {"access", "consistency", "requester_pays", "session_kwargs", "default_location"}
)
_SECRET_FIELDS = ("private_key", "private_key_id", "client_secret", "refresh_token", "token")


@dataclass(frozen=True, repr=False)
class GCSOptions:
    """Resolved settings of one GCS checkpoint root.

    Example::

        GCSOptions.resolve({}, env={"STORAGE_EMULATOR_HOST": "127.0.0.1:9023"})
    """

    endpoint_url: str = DEFAULT_ENDPOINT
    project: str | None = None
    token: Any = None
    part_size: int = 16 * MiB
    composite_threshold: int = 64 * MiB
    max_concurrency: int = 16
    buffer_bytes: int = 256 * MiB
    connect_timeout: float = 10.0
    read_timeout: float = 60.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    passthrough: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.part_size < _MIN_PART_SIZE:
            raise ValueError(f"part_size must be at least 256 KiB, got {self.part_size}")
        if self.max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")
        if self.buffer_bytes < self.part_size:
            raise ValueError(
                f"buffer_bytes ({self.buffer_bytes}) must hold at least one part "
                f"({self.part_size}); raise buffer_bytes or lower part_size"
            )

    @classmethod
    def resolve(
        cls, options: Mapping[str, Any], env: Mapping[str, str] | None = None
    ) -> GCSOptions:
        """Options from keyword arguments first, then ``env`` (default: ``os.environ``).

        Unknown names raise :class:`TypeError` listing the accepted ones.
        """
        env = os.environ if env is None else env
        given = dict(options)
        passthrough = {name: given.pop(name) for name in list(given) if name in _GCSFS_PASSTHROUGH}
        retries = given.pop("retries", None)
        if retries is None:
            retries = env.get("CKPTSTORE_GCS_RETRIES") or 7
        retry = RetryPolicy(
            attempts=int(retries) + 1,
            base_delay=float(given.pop("retry_base_delay", 0.1)),
            max_delay=float(given.pop("retry_max_delay", 5.0)),
        )
        known = {f.name for f in fields(cls)} - {"retry", "passthrough"}
        unknown = sorted(set(given) - known)
        if unknown:
            accepted = sorted(known | _GCSFS_PASSTHROUGH | {"retries", "retry_base_delay"})
            raise TypeError(
                f"unknown GCS storage option(s) {unknown}; accepted: {', '.join(accepted)}"
            )
        emulator = env.get("STORAGE_EMULATOR_HOST") or ""
        if emulator and "://" not in emulator:
            emulator = f"http://{emulator}"
        values: dict[str, Any] = dict(given)
        if not values.get("endpoint_url"):
            values["endpoint_url"] = emulator or DEFAULT_ENDPOINT
        values["endpoint_url"] = str(values["endpoint_url"]).rstrip("/")
        if not values.get("project"):
            values["project"] = env.get("GOOGLE_CLOUD_PROJECT") or env.get("GCLOUD_PROJECT")
        if values.get("token") is None and values["endpoint_url"] != DEFAULT_ENDPOINT:
            values["token"] = "anon"
        for name, variable in (
            ("part_size", "CKPTSTORE_GCS_PART_SIZE"),
            ("max_concurrency", "CKPTSTORE_GCS_MAX_CONCURRENCY"),
        ):
            if name not in values and env.get(variable):
                values[name] = int(env[variable])
        return cls(**values, retry=retry, passthrough=passthrough)

    def secrets(self) -> tuple[str, ...]:
        """Credential values known to these options (to mask in messages)."""
        token = self.token
        if isinstance(token, Mapping):
            return tuple(str(token[name]) for name in _SECRET_FIELDS if token.get(name))
        if isinstance(token, str) and token not in ("anon", "google_default", "cloud", "cache"):
            return () if os.path.exists(token) else (token,)
        return ()

    def mask(self, text: str) -> str:
        """``text`` with every credential value replaced by ``***``."""
        return mask(text, self.secrets())

    def __repr__(self) -> str:
        token = self.token
        credentials = (
            "anonymous"
            if token == "anon"
            else "default chain"
            if token is None
            else f"file {token!r}"
            if isinstance(token, str) and os.path.exists(token)
            else f"method {token!r}"
            if token in ("google_default", "cloud", "cache")
            else "explicit"
        )
        return (
            f"GCSOptions(endpoint_url={self.endpoint_url!r}, project={self.project!r}, "
            f"credentials={credentials}, part_size={self.part_size}, "
            f"max_concurrency={self.max_concurrency}, retries={self.retry.attempts - 1})"
        )

    def gcsfs_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for :class:`gcsfs.GCSFileSystem`."""
        kwargs: dict[str, Any] = {
            "token": self.token,
            "skip_instance_cache": True,
            **self.passthrough,
        }
        if self.project:
            kwargs["project"] = self.project
        if self.endpoint_url != DEFAULT_ENDPOINT:
            kwargs["endpoint_url"] = self.endpoint_url
        return kwargs
