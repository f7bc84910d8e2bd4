"""The attacks that apply to object stores, run on S3 (moto) for zarr and npz (and LMDB
where its layout differs), and the oversized-document ones on GCS too
(gcp-storage-emulator): forged control documents larger than the document limit,
forged sizes and offsets, truncated objects, keys leading out of the prefix, forged
commit records.

Each case trains a run on the store, copies it down, forges the copy with the same
code as the local attacks (``tests/attacks/attacks.py``) and puts back what changed.
Then a load raises ``CorruptCheckpointError`` naming the epoch (never a checksum) in
bounded memory (an oversized document in less than the document limit: it is refused
by the size the download's response declares, before its body is read), and a
``JobRunner`` resume falls back to the newest intact epoch, every request it makes
(seen by a proxy in front of the store) staying under the prefix.
"""

from __future__ import annotations

import logging
import tracemalloc
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ckptstore.checkpoint._multinode import MultiNodeCheckpointManager
from ckptstore.checkpoint._runner import JobRunner
from ckptstore.errors import CheckpointNotFoundError, CkptStoreError, CorruptCheckpointError
from ckptstore.execution._session import LocalSession
from ckptstore.plugin._path_type import PathType
from ckptstore.plugin._registry import get_registry
from ckptstore.records import current_limits, set_limits
from ckptstore.records._layout import CONTROL_DIR
from ckptstore.testing.conformance.jobs import NODES, counting_job, expected_state
from ckptstore.testing.fixtures import PREFIX
from ckptstore.testing.proxy import FaultProxy
from tests.attacks.attacks import ATTACKS, Spec
from tests.attacks.forge import EPOCH, Forge
from tests.attacks.test_attacks import MEMORY_BOUND, db_type

DOCUMENT_LIMIT = 1 << 20
"""The document limit while a forgery is loaded (the default, 64 MiB, would make every
oversized forgery a 64 MiB upload)."""
OVERSIZED = 8 << 20
"""How large a forged oversized document is."""
BOTH = ("zarr", "npz")
ALL = (*BOTH, "lmdb")
LOCAL_ONLY = ("lmdb",)
"""Formats written on local disk only (``needs_rename``): their runs reach the store
as ``ckptstore cp`` puts them there, object by object, and are read from it."""


def _padded(data: bytes) -> bytes:
    """``data`` followed by spaces (still valid JSON) up to :data:`OVERSIZED` bytes."""
    return data + b" " * (OVERSIZED - len(data))


def oversized_manifest_object(forge: Forge, outside: Path) -> None:
    forge.write_manifest_bytes(_padded(forge.manifest_path.read_bytes()))


def oversized_commit_object(forge: Forge, outside: Path) -> None:
    forge.write_commit_bytes(_padded(forge.commit_path.read_bytes()))


def oversized_catalog_entry(forge: Forge, outside: Path) -> None:
    entry = forge.root / CONTROL_DIR / "catalog" / f"epoch-{forge.epoch}.json"
    entry.write_bytes(_padded(entry.read_bytes()))


OVERSIZED_ATTACKS = {
    # every format: the manifest's size is the format's (LMDB's, with its gap records, is
    # the largest)
    "oversized_manifest_object": Spec(oversized_manifest_object, ALL, in_manifest=True),
    # not on LMDB: a commit record and a catalog entry are the same documents whatever
    # the format (and the catalog case checks the repair a new save makes, which LMDB
    # cannot make on an object store)
    "oversized_commit_object": Spec(oversized_commit_object, BOTH, in_manifest=True),
    "oversized_catalog_entry": Spec(oversized_catalog_entry, BOTH, in_manifest=True),
}
ON_DATA_OBJECTS = ["truncated_blob_file", "shape_10e12", "offset_beyond_file"]
"""Attacks on the data objects, whose layout differs between the formats (LMDB's
``data.mdb`` holds its values between B-tree pages, recorded as checksummed gaps)."""
ON_ZARR = [
    "offset_2_64",
    "negative_size",
    "traversal_chunk_key",
    "absolute_chunk_key",
    "deep_json_commit",
    "commit_of_other_epoch",
]
"""Attacks on fields every format's manifest and commit record share (checked by the
same code whatever the format: zarr covers them)."""
OBJECT_ATTACKS: dict[str, Spec] = {
    **OVERSIZED_ATTACKS,
    **{name: replace(ATTACKS[name], formats=ALL) for name in ON_DATA_OBJECTS},
    **{name: replace(ATTACKS[name], formats=("zarr",)) for name in ON_ZARR},
}
CASES = [
    pytest.param(("s3", name, fmt), id=f"s3-{name}-{fmt}")
    for name, spec in OBJECT_ATTACKS.items()
    for fmt in spec.formats
] + [
    pytest.param(("gcs", name, "zarr"), id=f"gcs-{name}-zarr")
    for name in ["oversized_manifest_object", "oversized_commit_object"]
]
LOAD_CASES = [case for case in CASES if "catalog" not in str(case.id)]
"""A load names its epoch: it reads commit records and manifests, never the catalog."""


# -- a run on the store, forged through a local copy ---------------------------------------


def copy_down(storage: PathType, local: Path) -> dict[str, bytes]:
    """Every object of the run, written under ``local``; returns them by key."""
    objects = {key: storage.read_bytes(key) for key in storage.list_keys()}
    for key, data in objects.items():
        (local / key).parent.mkdir(parents=True, exist_ok=True)
        (local / key).write_bytes(data)
    return objects


def put_back(storage: PathType, local: Path, before: dict[str, bytes]) -> list[str]:
    """Upload the files of ``local`` that changed since :func:`copy_down`, delete the
    objects whose file is gone; returns the keys changed."""
    now = {
        str(path.relative_to(local)): path.read_bytes()
        for path in local.rglob("*")
        if path.is_file() and not path.is_symlink()
    }
    changed = sorted(key for key, data in now.items() if before.get(key) != data)
    for key in changed:
        storage.write_bytes(key, now[key])
    gone = sorted(set(before) - set(now))
    storage.delete(gone)
    return changed + gone


def assert_under_prefix(proxy: FaultProxy, bucket: str) -> None:
    """Every request the proxy saw named an object under the prefix, or listed under
    it (S3 path-style ``/BUCKET/ckpt/...``, GCS ``/.../b/BUCKET/o/ckpt%2F...``)."""
    seen = proxy.requests
    assert seen
    for request in seen:
        path = urllib.parse.unquote(request.path)
        segments = path.split("/")
        assert ".." not in segments, request
        assert bucket in segments, request
        after = "/".join(segments[segments.index(bucket) + 1 :])
        if after.startswith("o/"):  # the GCS JSON API: /storage/v1/b/BUCKET/o/NAME
            after = after.removeprefix("o/")
        assert after in ("", "o") or after.startswith(f"{PREFIX}/"), request
        query = urllib.parse.unquote(request.query)
        if "prefix=" in query:
            assert f"prefix={PREFIX}/" in query, request


@dataclass
class ObjectForgery:
    url: str
    options: dict[str, Any]
    """Storage options through the proxy, which records every request."""
    direct: dict[str, Any]
    """Storage options straight to the server (the proxy, in this process, buffers
    whole responses: it would weigh on the memory measured)."""
    bucket: str
    proxy: FaultProxy
    spec: Spec
    name: str
    fmt: str
    crcs: set[int]

    def manager(self, *, direct: bool = False, **options: Any) -> MultiNodeCheckpointManager:
        storage_options = self.direct if direct else self.options
        return MultiNodeCheckpointManager(
            self.url, db_type(self.fmt), storage_options=storage_options, **options
        )

    def stored(self) -> dict[str, bytes]:
        """Every object of the run but the writers' leases, read straight from the
        server."""
        storage = get_registry().open_path(self.url, **self.direct)
        try:
            return {
                key: storage.read_bytes(key)
                for key in storage.list_keys()
                if not key.startswith(f"{CONTROL_DIR}/lease/")
            }
        finally:
            storage.close()

    def assert_requests_stayed_under_the_prefix(self) -> None:
        assert_under_prefix(self.proxy, self.bucket)


@pytest.fixture
def object_forgery(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ObjectForgery]:
    store, name, fmt = request.param
    proxy: FaultProxy = request.getfixturevalue(f"{store}_faults")
    url: str = request.getfixturevalue(f"{store}_url")
    options: dict[str, Any] = request.getfixturevalue(f"{store}_storage_options")
    server = request.getfixturevalue(f"{store}_server")
    direct = {**options, "endpoint_url": server.endpoint_url}
    storage = get_registry().open_path(url, **options)
    if fmt in LOCAL_ONLY:  # written on local disk only: trained there, uploaded as is
        trained = tmp_path / "trained"
        manager = MultiNodeCheckpointManager(str(trained), fmt, metadata_handler="json")
        assert JobRunner(counting_job(epochs=EPOCH), manager).train(LocalSession()) == EPOCH
        put_back(storage, trained, {})
    else:
        manager = MultiNodeCheckpointManager(
            url, db_type(fmt), metadata_handler="json", storage_options=options
        )
        assert JobRunner(counting_job(epochs=EPOCH), manager).train(LocalSession()) == EPOCH
    local = tmp_path / "run"
    before = copy_down(storage, local)
    forge = Forge(local)
    crcs = forge.recorded_crcs()
    spec = OBJECT_ATTACKS[name]
    spec.attack(forge, tmp_path)
    assert put_back(storage, local, before), "the attack changed nothing"
    storage.close()
    proxy.clear()
    set_limits(replace(current_limits(), max_document_bytes=DOCUMENT_LIMIT))
    try:
        bucket = url.split("/")[2]
        yield ObjectForgery(url, options, direct, bucket, proxy, spec, name, fmt, crcs)
    finally:
        set_limits(None)


def _load_peak(forgery: ObjectForgery, epoch: int) -> tuple[int, BaseException | None]:
    """Peak traced memory of loading ``epoch`` with a new manager, and what it raised."""
    manager = forgery.manager(direct=True)
    session = LocalSession()
    raised: BaseException | None = None
    tracemalloc.start()
    try:
        session.run(manager.init(list(NODES), retrieve_from_epoch=epoch))
        session.run(manager.load(epoch))
    except CkptStoreError as error:
        raised = error
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak, raised


@pytest.mark.parametrize("object_forgery", LOAD_CASES, indirect=True)
def test_load_raises_a_typed_error_in_bounded_memory(object_forgery: ObjectForgery) -> None:
    # an intact load first: what any load costs (the S3 client's service model alone
    # is several MiB), and anything it caches is there for the forged load too
    baseline, intact = _load_peak(object_forgery, EPOCH - 1)
    assert intact is None
    peak, error = _load_peak(object_forgery, EPOCH)
    assert error is not None
    expected = (CorruptCheckpointError, CheckpointNotFoundError)
    assert isinstance(error, expected if object_forgery.spec.whole_run else CorruptCheckpointError)
    message = str(error)
    assert "\n" not in message
    assert f"epoch {EPOCH}" in message or f"epoch-{EPOCH}" in message
    for crc in object_forgery.crcs:
        assert str(crc) not in message
        assert f"{crc:08x}" not in message.lower()
    assert peak < MEMORY_BOUND
    if object_forgery.name in OVERSIZED_ATTACKS:
        assert "more than the limit" in message
        assert peak < baseline + DOCUMENT_LIMIT // 2  # refused before its body was read


@pytest.mark.parametrize("object_forgery", CASES, indirect=True)
def test_resume_falls_back_to_the_newest_intact_epoch(
    object_forgery: ObjectForgery, caplog: pytest.LogCaptureFixture
) -> None:
    manager = object_forgery.manager(metadata_handler="json")
    # LMDB is written on local disk only, so its job stops at the intact epoch it falls
    # back to (a job at its limit restores and saves nothing); that a save there is
    # refused before anything is retracted: plugins/ckptstore-lmdb/tests
    read_only = object_forgery.fmt in LOCAL_ONLY
    limit = EPOCH - 1 if read_only else EPOCH
    runner = JobRunner(counting_job(epochs=limit), manager)
    stored = object_forgery.stored() if read_only else {}
    session = LocalSession()
    with caplog.at_level(logging.WARNING):
        assert runner.train(session) == limit
    if runner.restore_failures:  # the load of epoch 2 failed: the runner fell back
        assert [failure.epoch for failure in runner.restore_failures] == [EPOCH]
        assert isinstance(runner.restore_failures[0].error, CorruptCheckpointError)
        assert f"Epoch {EPOCH} cannot be restored" in caplog.text
    elif object_forgery.name == "oversized_catalog_entry":  # epoch 2 itself is intact
        assert f"catalog/epoch-{EPOCH}.json" in caplog.text  # refused, loudly, and repaired
    else:  # its commit record is unreadable: the catalog skipped it, loudly
        assert f"skipping epoch {EPOCH}" in caplog.text.lower()
    if read_only:  # epoch 1 restored, and nothing saved over the forgery
        assert runner.already_finished
        for node in NODES:
            for name, value in expected_state(node, EPOCH - 1).items():
                assert np.array_equal(session.workspace(node)[name], value)
        assert object_forgery.stored() == stored  # nothing saved over the forgery
        object_forgery.assert_requests_stayed_under_the_prefix()
        return
    # epoch 2 was saved again, intact, over the forgery
    session = LocalSession()
    reader = object_forgery.manager()
    session.run(reader.init(list(NODES), retrieve_from_epoch=EPOCH))
    session.run(reader.load(EPOCH))
    object_forgery.assert_requests_stayed_under_the_prefix()
