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

    >>> GCSOptions.resolve({"endpoint_url": "http://127.0.0.1:9023", "token": "anon"}).endpoint_url
    'http://127.0.0.1:9023'
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ckptstore.object_store import ObjectStoreOptions

__all__ = ["GCSOptions"]

MiB = 1 << 20
DEFAULT_ENDPOINT = "https://storage.googleapis.com"
_MIN_PART_SIZE = 256 << 10
_GCSFS_PASSTHROUGH = frozenset(
    {"access", "consistency", "requester_pays", "session_kwargs", "default_location"}
)
_SECRET_FIELDS = ("private_key", "private_key_id", "client_secret", "refresh_token", "token")


@dataclass(frozen=True, repr=False)
class GCSOptions(ObjectStoreOptions):
    """Resolved settings of one GCS checkpoint root (the shared ones are
    :class:`~ckptstore.object_store.ObjectStoreOptions`'s).

    Example::

        >>> GCSOptions.resolve({}, env={"STORAGE_EMULATOR_HOST": "127.0.0.1:9023"}).endpoint_url
        'http://127.0.0.1:9023'
    """

    STORE = "GCS"
    DEFAULT_ENDPOINT = DEFAULT_ENDPOINT
    ENV_PREFIX = "CKPTSTORE_GCS"
    PASSTHROUGH = _GCSFS_PASSTHROUGH

    endpoint_url: str = DEFAULT_ENDPOINT
    project: str | None = None
    token: Any = None
    composite_threshold: int = 64 * MiB

    def __post_init__(self) -> None:
        if self.part_size < _MIN_PART_SIZE:
            raise ValueError(f"part_size must be at least 256 KiB, got {self.part_size}")
        if self.max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")
        super().__post_init__()

    @property
    def parts_threshold(self) -> int:
        return self.composite_threshold

    @classmethod
    def _with_environment(cls, given: dict[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
        emulator = env.get("STORAGE_EMULATOR_HOST") or ""
        if emulator and "://" not in emulator:
            emulator = f"http://{emulator}"
        values: dict[str, Any] = dict(given)
        if not values.get("endpoint_url"):
            values["endpoint_url"] = emulator or DEFAULT_ENDPOINT
        if isinstance(values["endpoint_url"], str):  # else refused, named, by the base class
            values["endpoint_url"] = values["endpoint_url"].rstrip("/")
        if not values.get("project"):
            values["project"] = env.get("GOOGLE_CLOUD_PROJECT") or env.get("GCLOUD_PROJECT")
        if values.get("token") is None and values["endpoint_url"] != DEFAULT_ENDPOINT:
            values["token"] = "anon"
        return values

    def secrets(self) -> tuple[str, ...]:
        """Credential values known to these options (to mask in messages)."""
        token = self.token
        if isinstance(token, Mapping):
            return tuple(str(token[name]) for name in _SECRET_FIELDS if token.get(name))
        if isinstance(token, str) and token not in ("anon", "google_default", "cloud", "cache"):
            return () if os.path.exists(token) else (token,)
        return ()

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

    def open_filesystem(self, url: str) -> tuple[Any, str]:
        """gcsfs's plain filesystem: its default "extended" one asks a gRPC API for each
        bucket's layout first (emulators lack it), and nothing here needs it."""
        # imported here: gcsfs takes 0.2-0.3 s to import, which every process that
        # builds ckptstore's plugin registry paid when it was imported with the module
        from gcsfs.core import GCSFileSystem

        root = url.split("://", 1)[1] if "://" in url else url
        return GCSFileSystem(**self.gcsfs_kwargs()), root.strip("/")

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
