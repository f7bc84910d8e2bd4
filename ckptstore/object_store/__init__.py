"""What every object-store path type shares (``ckptstore-s3``, ``ckptstore-gcs``...).

A backend plugin subclasses :class:`ObjectStorePath`, :class:`ObjectStoreOptions` and
:class:`ObjectStoreClient` (one method per request kind, and a
:class:`MultipartUpload` for objects sent in parts) and tells the retry loop how to
judge its errors with :class:`ErrorRules`; requests, retries, parallel parts, streamed
bodies, write streams and credential masking come from here. Nothing here imports a
backend's SDK. See ``docs/object-stores.md``.

Example::

    >>> from ckptstore_s3 import S3Path  # the ckptstore-s3 plugin's backend
    >>> issubclass(S3Path, ObjectStorePath), S3Path.name, S3Path.protocols
    (True, 's3', ('s3', 's3a'))
    >>> issubclass(S3Path.options_type, ObjectStoreOptions)  # settings, filesystem
    True
    >>> issubclass(S3Path.client_type, ObjectStoreClient)  # one method per request kind
    True
    >>> isinstance(S3Path.client_type.rules, ErrorRules)  # which failures are retried
    True
"""

from ckptstore.io import slice_views
from ckptstore.object_store._aio import gather_all
from ckptstore.object_store._body import Body, PartsReader, StreamedBody, request_body
from ckptstore.object_store._client import ObjectInfo, ObjectStoreClient
from ckptstore.object_store._failures import (
    ErrorRules,
    Failure,
    MissingObjectError,
    RangeNotSatisfiableError,
    RequestError,
)
from ckptstore.object_store._listing import KeysAfter, keys_around
from ckptstore.object_store._masking import (
    MIN_SECRET_LENGTH,
    credential_values,
    is_credential_name,
    mask,
    masking_logs,
    url_secrets,
)
from ckptstore.object_store._multipart import MultipartUpload, upload_in_parts
from ckptstore.object_store._options import ObjectStoreOptions
from ckptstore.object_store._path import ObjectStorePath
from ckptstore.object_store._ranged import Read, declared_size
from ckptstore.object_store._retry import RetryPolicy, call_with_retries
from ckptstore.object_store._writer import MultipartWriter

__all__ = [
    "MIN_SECRET_LENGTH",
    "Body",
    "ErrorRules",
    "Failure",
    "KeysAfter",
    "MissingObjectError",
    "MultipartUpload",
    "MultipartWriter",
    "ObjectInfo",
    "ObjectStoreClient",
    "ObjectStoreOptions",
    "ObjectStorePath",
    "PartsReader",
    "RangeNotSatisfiableError",
    "Read",
    "RequestError",
    "RetryPolicy",
    "StreamedBody",
    "call_with_retries",
    "credential_values",
    "declared_size",
    "gather_all",
    "is_credential_name",
    "keys_around",
    "mask",
    "masking_logs",
    "request_body",
    "slice_views",
    "upload_in_parts",
    "url_secrets",
]
