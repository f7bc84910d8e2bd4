"""S3 through the whole object-store kit (path-type and DB-type conformance, jobs, two
tiers, faults) against a moto server, plus what only S3 does: multipart parts, and
AWS itself when nothing says otherwise."""

from __future__ import annotations

import pytest
from ckptstore_s3 import S3Path

from ckptstore import LocalSession
from ckptstore.testing.object_store import ObjectStoreKit, StoreUnderTest
from ckptstore.testing.object_store.store import assert_blobs, reload, saver


class TestS3(ObjectStoreKit):
    path_type = S3Path
    server = "s3"
    environment = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID")
    part_size = 5 << 20

    def test_large_blobs_go_up_as_parallel_multipart_uploads(self, store: StoreUnderTest) -> None:
        session = LocalSession()
        # the node's one archive goes up in parts once it reaches the threshold
        manager = saver(store, session, multipart_threshold=store.part_size)
        session.run(manager.save(1))
        parts = [r for r in store.faults.requests if r.method == "PUT" and "partNumber" in r.params]
        assert len(parts) == 3  # 12.5 MiB of data in 5 MiB parts
        assert_blobs(store, reload(manager, session, 1))

    def test_without_settings_a_url_means_aws_itself(
        self, store: StoreUnderTest, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        for variable in store.environment:
            monkeypatch.delenv(variable)
        with pytest.raises(OSError, match="could not"):
            S3Path(store.url, retries=0).read_bytes("anything")  # AWS itself: no credentials
