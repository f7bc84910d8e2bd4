"""S3 multipart uploads behind ckptstore's :class:`~ckptstore.object_store.MultipartUpload`:
create, upload parts (numbered from 1), complete, or abort.

Example::

    >>> options = s3_options("multipart-module")  # endpoint and keys of a fresh bucket
    >>> from ckptstore_s3 import S3Path
    >>> client = S3Path("s3://multipart-module/run", **options).client
    >>> upload = S3MultipartUpload(client, "run/trainer_0.3/blobs.npz")
    >>> async def send():
    ...     await upload.start()
    ...     await upload.upload_part(0, b"one part: the last may be small")
    ...     await upload.complete()
    >>> client.run(send)
    >>> client.run(lambda: client.size("run/trainer_0.3/blobs.npz"))
    31
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ckptstore.object_store import Body, MultipartUpload, RequestError

if TYPE_CHECKING:
    from ckptstore_s3.client import S3Client

__all__ = ["S3MultipartUpload"]


class S3MultipartUpload(MultipartUpload):
    """One S3 multipart upload; part ``index`` is S3's part number ``index + 1``.

    Example::

        >>> options = s3_options("upload-in-parts")  # endpoint and keys of a fresh bucket
        >>> from ckptstore.object_store import upload_in_parts
        >>> from ckptstore_s3 import S3Path
        >>> client = S3Path("s3://upload-in-parts/run", **options).client
        >>> parts = [b"a" * (5 << 20), b"b" * 3]  # all but the last part: at least 5 MiB
        >>> client.run(lambda: upload_in_parts(S3MultipartUpload(client, "run/big"), 2,
        ...                                    parts.__getitem__, limit=16))
        >>> client.run(lambda: client.size("run/big"))
        5242883
    """

    def __init__(self, client: S3Client, key: str) -> None:
        super().__init__(key)
        self._client = client
        self._upload_id: str | None = None
        self._etags: dict[int, str] = {}

    @property
    def upload_id(self) -> str:
        """S3's id of the upload (once started)."""
        if self._upload_id is None:
            raise RuntimeError(f"the multipart upload of {self.key!r} was not started")
        return self._upload_id

    async def start(self) -> None:
        response = await self._client.call(
            "create_multipart_upload",
            self._client.describe("start multipart upload of", self.key),
            Key=self.key,
        )
        self._upload_id = str(response["UploadId"])

    async def upload_part(self, index: int, body: Body) -> None:
        number = index + 1
        response = await self._client.call(
            "upload_part",
            self._client.describe(f"PUT part {number} of", self.key),
            Key=self.key,
            UploadId=self.upload_id,
            PartNumber=number,
            Body=body,
        )
        self._etags[number] = response["ETag"]

    async def complete(self) -> None:
        parts = [
            {"PartNumber": number, "ETag": etag} for number, etag in sorted(self._etags.items())
        ]
        await self._client.call(
            "complete_multipart_upload",
            self._client.describe("complete multipart upload of", self.key),
            Key=self.key,
            UploadId=self.upload_id,
            MultipartUpload={"Parts": parts},
        )

    async def abort(self) -> None:
        """Abort the upload; failures are ignored (the bucket's lifecycle rule for
        incomplete uploads cleans up what this cannot)."""
        if self._upload_id is None:
            return
        try:
            await self._client.call(
                "abort_multipart_upload",
                self._client.describe("abort multipart upload of", self.key),
                Key=self.key,
                UploadId=self._upload_id,
            )
        except RequestError:
            return
