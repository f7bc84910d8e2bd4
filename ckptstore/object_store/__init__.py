"""What every object-store path type shares (``ckptstore-s3``, ``ckptstore-gcs``...).

A backend plugin subclasses :class:`ObjectStorePath`, :class:`ObjectStoreOptions` and
:class:`ObjectStoreClient` (one method per request kind, and a
:class:`MultipartUpload` for objects sent in parts) and tells the retry loop how to
judge its errors with :class:`ErrorRules`; requests, retries, parallel parts, streamed
bodies, write streams and credential masking come from here. Nothing here imports a
backend's SDK. See ``docs/object-stores.md``.

Example::

    class MyStorePath(ObjectStorePath):
        name = "mystore"
        protocols = ("my",)
        ...
"""

from ckptstore.object_store.body import Body, PartsReader, request_body, slice_views
from ckptstore.object_store.client import ObjectInfo, ObjectStoreClient
from ckptstore.object_store.failures import (
    ErrorRules,
    Failure,
    MissingObjectError,
    RangeNotSatisfiableError,
    RequestError,
)
from ckptstore.object_store.masking import mask
from ckptstore.object_store.multipart import MultipartUpload, upload_in_parts
from ckptstore.object_store.options import ObjectStoreOptions
from ckptstore.object_store.path import ObjectStorePath
from ckptstore.object_store.retry import RetryPolicy, call_with_retries
from ckptstore.object_store.writer import MultipartWriter

__all__ = [
    "Body",
    "ErrorRules",
    "Failure",
    "MissingObjectError",
    "MultipartUpload",
    "MultipartWriter",
    "ObjectInfo",
    "ObjectStoreClient",
    "ObjectStoreOptions",
    "ObjectStorePath",
    "PartsReader",
    "RangeNotSatisfiableError",
    "RequestError",
    "RetryPolicy",
    "call_with_retries",
    "mask",
    "request_body",
    "slice_views",
    "upload_in_parts",
]
