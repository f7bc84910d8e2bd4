"""GCS through the whole object-store kit (path-type and DB-type conformance, jobs, two
tiers, faults) against a GCS emulator. Only GCS composes: large blobs go up as
temporary part objects, composed, then cleaned up."""

from __future__ import annotations

import pytest
from ckptstore_gcs import GCSPath

from ckptstore import LocalSession
from ckptstore.errors import DocumentChangedError, KeyExistsError
from ckptstore.plugin import PathType
from ckptstore.testing import GcsEmulator
from ckptstore.testing.object_store import ObjectStoreKit, StoreUnderTest
from ckptstore.testing.object_store.store import assert_blobs, reload, saver


class TestGCS(ObjectStoreKit):
    path_type = GCSPath
    server = "gcs"
    environment = ("STORAGE_EMULATOR_HOST",)
    part_size = 1 << 20

    def races_are_refused(self, storage: PathType) -> bool:
        """GCS refuses a second ``ifGenerationMatch=0`` upload; gcp-storage-emulator
        ignores the precondition (docs/object-stores.md), so there only the HEAD that
        goes first refuses creates, and racing ones can all succeed."""
        return honours_if_generation_match(storage)

    def replaces_are_refused(self, storage: PathType) -> bool:
        """The same for ``ifGenerationMatch=<generation>``: on the emulator only the
        metadata request that goes first refuses a stale replace, not racing ones."""
        return honours_if_generation_match(storage)

    def test_replaces_send_the_generation_and_fall_back_to_a_head(
        self, store: StoreUnderTest
    ) -> None:
        storage = GCSPath(store.url, **store.storage_options)
        storage.create_document("_ckptstore/lease/n.json", b"first")
        current = storage.get_versioned_document("_ckptstore/lease/n.json")
        assert current is not None
        assert current[1].isdigit()  # the object's generation
        storage.replace_document("_ckptstore/lease/n.json", b"second", current[1])
        uploads = [r for r in store.faults.requests if r.method == "POST" and "upload" in r.path]
        assert uploads[-1].params.get("ifGenerationMatch") == [current[1]]
        with pytest.raises(DocumentChangedError):  # refused by the HEAD, even on the emulator
            storage.replace_document("_ckptstore/lease/n.json", b"stale", current[1])
        assert storage.get_document("_ckptstore/lease/n.json") == b"second"

    def test_creates_send_the_precondition_and_fall_back_to_a_head(
        self, store: StoreUnderTest
    ) -> None:
        storage = GCSPath(store.url, **store.storage_options)
        storage.create_document("_ckptstore/lease/n.json", b"first")
        uploads = [r for r in store.faults.requests if r.method == "POST" and "upload" in r.path]
        assert uploads[-1].params.get("ifGenerationMatch") == ["0"]
        with pytest.raises(KeyExistsError):  # refused by the HEAD, even on the emulator
            storage.create_document("_ckptstore/lease/n.json", b"second")
        assert storage.get_document("_ckptstore/lease/n.json") == b"first"

    def test_the_emulator_ignores_if_generation_match(self, store: StoreUnderTest) -> None:
        # if this starts failing, the emulator learnt preconditions: drop races_are_refused
        # and the note in docs/object-stores.md
        assert not honours_if_generation_match(GCSPath(store.url, **store.storage_options))

    def test_large_blobs_go_up_as_composite_uploads(self, store: StoreUnderTest) -> None:
        session = LocalSession()
        # the node's one archive goes up as a composite once it reaches the threshold
        manager = saver(store, session, composite_threshold=store.part_size)
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


def honours_if_generation_match(storage: PathType) -> bool:
    """Whether the server refuses an ``ifGenerationMatch=0`` upload over an existing
    object (a probe object is written and deleted)."""
    assert isinstance(storage, GCSPath)
    client = storage.client
    name = storage._object("_ckptstore/precondition-probe")
    storage.write_bytes("_ckptstore/precondition-probe", b"1")
    try:
        client.run(
            lambda: client.request(
                "POST",
                f"{client.endpoint}/upload/storage/v1/b/{client.bucket}/o",
                "probe",
                params={"uploadType": "media", "name": name, "ifGenerationMatch": "0"},
                data=b"2",
            )
        )
    except OSError as error:
        return getattr(error, "status", None) == 412
    finally:
        storage.delete(["_ckptstore/precondition-probe"])
    return False
