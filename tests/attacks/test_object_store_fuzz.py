"""The structured fuzzer of ``test_fuzz.py`` against S3 (moto), for zarr and npz.

A pristine run is uploaded to a fresh bucket once per format; each example mutates
one stored object of epoch 1 (the same byte and JSON-structure mutations as on local
disk, minus links, which object stores do not have), optionally re-signs every
checksum, uploads what changed and loads the epoch from S3. Property: the load
returns exactly the saved values (or, re-signed, values of the recorded dtypes and
shapes) or raises a ``CkptStoreError``; memory stays bounded; every request stays
under the prefix. The ``ci`` profile runs a handful of examples per format (each is a
few round trips to the server); ``CKPTSTORE_FUZZ_PROFILE=long`` runs the long campaign.
"""

from __future__ import annotations

import contextlib
import json
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptstore.checkpoint._multinode import MultiNodeCheckpointManager
from ckptstore.checkpoint._runner import JobRunner
from ckptstore.errors import CkptStoreError
from ckptstore.execution._session import LocalSession
from ckptstore.plugin._path_type import PathType
from ckptstore.plugin._registry import get_registry
from ckptstore.testing.conformance.jobs import NODES, counting_job
from ckptstore.testing.proxy import FaultProxy
from tests.attacks.forge import Forge
from tests.attacks.test_attacks import db_type
from tests.attacks.test_fuzz import (
    CAMPAIGN_MARKS,
    EPOCH,
    MEMORY_BOUND,
    PROFILE,
    PROFILE_NAME,
    Values,
    assert_loaded_matches,
    forge_drawn,
)
from tests.attacks.test_object_store_attacks import assert_under_prefix, copy_down, put_back

OBJECT_PROFILE = settings(PROFILE, max_examples=3) if PROFILE_NAME == "ci" else PROFILE
"""Three examples per format in CI (each is several requests to the server); the long
campaign as on local disk."""
pytestmark = CAMPAIGN_MARKS


@dataclass(frozen=True)
class PristineRun:
    fmt: str
    run: Path
    values: Values
    targets: tuple[str, ...]  # objects of epoch 1 that may be mutated, relative to run


@pytest.fixture(scope="module", params=["zarr", "npz"])
def pristine_run(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> PristineRun:
    """A run of the format on local disk, with its values, to upload for each test."""
    fmt = request.param
    run = tmp_path_factory.mktemp(f"object-pristine-{fmt}") / "run"
    manager = MultiNodeCheckpointManager(str(run), db_type(fmt), metadata_handler="json")
    assert JobRunner(counting_job(epochs=EPOCH), manager).train(LocalSession()) == EPOCH
    forge = Forge(run, NODES[0], EPOCH)
    targets = sorted(
        str(path.relative_to(run))
        for path in [*forge.db.rglob("*"), *forge.commit_path.parent.glob("*.json")]
        if path.is_file()
    )
    values = _load(str(run), fmt, {}, run)
    return PristineRun(fmt, run, values, tuple(targets))


def _load(url: str, fmt: str, options: dict[str, Any], local: Path) -> Values:
    session = LocalSession()
    manager = MultiNodeCheckpointManager(url, db_type(fmt), storage_options=options)
    session.run(manager.init(list(NODES), retrieve_from_epoch=EPOCH))
    session.run(manager.load(EPOCH))
    values = {}
    for node in NODES:
        manifest = json.loads(Forge(local, node, EPOCH).manifest_path.read_bytes())
        values[node] = {name: session.fetch_blob(node, name) for name in manifest["blobs"]}
    return values


@dataclass
class Bucket:
    url: str
    options: dict[str, Any]
    storage: PathType
    local: Path
    objects: dict[str, bytes]  # key -> bytes as uploaded
    proxy: FaultProxy

    def upload_changes(self) -> None:
        put_back(self.storage, self.local, self.objects)

    def restore(self, pristine: PristineRun) -> None:
        """Put back the local copy and every object an example may have changed."""
        for target in pristine.targets:
            path = self.local / target
            original = self.objects[target]
            if not path.exists() or path.read_bytes() != original:
                path.write_bytes(original)
                self.storage.write_bytes(target, original)


@pytest.fixture
def bucket(
    pristine_run: PristineRun,
    s3_faults: FaultProxy,
    s3_url: str,
    s3_storage_options: dict[str, Any],
    tmp_path: Path,
) -> Iterator[Bucket]:
    storage = get_registry().open_path(s3_url, **s3_storage_options)
    for path in sorted(pristine_run.run.rglob("*")):
        if path.is_file():
            storage.write_bytes(str(path.relative_to(pristine_run.run)), path.read_bytes())
    local = tmp_path / "run"
    objects = copy_down(storage, local)
    yield Bucket(s3_url, s3_storage_options, storage, local, objects, s3_faults)
    storage.close()


@OBJECT_PROFILE
@given(data=st.data())
def test_any_forged_object_loads_exactly_or_fails_typed(
    pristine_run: PristineRun, bucket: Bucket, data: st.DataObject
) -> None:
    try:
        # no links: an object store has none (the local copy is uploaded as plain bytes)
        forged_signature = forge_drawn(
            data, bucket.local, pristine_run.targets, bucket.local, links=False
        )
        bucket.upload_changes()
        _check_load(pristine_run, bucket, exact=not forged_signature)
    finally:
        bucket.restore(pristine_run)


def _check_load(pristine: PristineRun, bucket: Bucket, *, exact: bool) -> None:
    bucket.proxy.clear()
    tracemalloc.start()
    try:
        try:
            loaded = _load(bucket.url, pristine.fmt, bucket.options, pristine.run)
        except CkptStoreError:
            loaded = None
        manager = MultiNodeCheckpointManager(
            bucket.url, db_type(pristine.fmt), storage_options=bucket.options
        )
        manager.set_params(nodes=list(NODES))
        with contextlib.suppress(CkptStoreError):
            manager.get_resume_from_epoch_id(None)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < MEMORY_BOUND
    assert_under_prefix(bucket.proxy, bucket.url.split("/")[2])
    assert_loaded_matches(loaded, pristine.values, exact=exact)
