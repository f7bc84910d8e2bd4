"""S3 multipart uploads behind ckptstore's :class:`~ckptstore.object_store.MultipartUpload`:
create, upload parts (numbered from 1), complete, or abort.

Example::

    upload = S3MultipartUpload(client, "run/trainer_0.3/blobs.npz")
    await upload.start()
    await upload.upload_part(0, body)
    await upload.complete()
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

        await upload_in_parts(S3MultipartUpload(client, key), 3, body_of_part, limit=16)
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
