"""GCS through the whole object-store kit (path-type and DB-type conformance, jobs, two
tiers, faults) against a GCS emulator. Only GCS composes: large blobs go up as
temporary part objects, composed, then cleaned up."""

from __future__ import annotations

from ckptstore_gcs import GCSPath

from ckptstore import LocalSession
from ckptstore.testing import GcsEmulator
from ckptstore.testing.object_store import ObjectStoreKit, StoreUnderTest
from ckptstore.testing.object_store.store import assert_blobs, reload, saver


class TestGCS(ObjectStoreKit):
    path_type = GCSPath
    server = "gcs"
    environment = ("STORAGE_EMULATOR_HOST",)
    part_size = 1 << 20

    def test_large_blobs_go_up_as_composite_uploads(self, store: StoreUnderTest) -> None:
        session = LocalSession()
        manager = saver(store, session)
        session.run(manager.save(1))
        assert len([r for r in store.faults.requests if r.path.endswith("/compose")]) == 1
        leftovers = [key for key in GCSPath(store.url).list_keys() if "ckptstore-part" in key]
        assert leftovers == []  # the temporary parts are cleaned up
        assert_blobs(store, reload(manager, session, 1))


def test_a_second_emulator_can_run_beside_the_session_one(gcs_server: GcsEmulator) -> None:
    with GcsEmulator() as other:
        assert other.port != gcs_server.port
        other.create_bucket("side")
        storage = GCSPath("gs://side/x", endpoint_url=other.endpoint_url)
        storage.write_bytes("k", b"v")
        assert other.object_keys("side") == ["x/k"]
