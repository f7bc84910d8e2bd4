"""Create-once and conditional replace on a GCS that enforces ``ifGenerationMatch``
(the ``gcs_strict_url`` fixture: the emulator patched to answer 412, as GCS does).

Each race is made as tight as it gets: every racer's conditional upload waits at a
barrier until all of them made their metadata request (so every racer found the
object where it expected it); then the uploads go, and only the store's precondition
can pick the winner. Against the plain emulator every racer would win.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np
import pytest
from ckptstore_gcs import GCSPath
from ckptstore_gcs.client import GCSClient

from ckptstore import CheckpointManager, LocalSession
from ckptstore.errors import (
    AlreadyCommittedError,
    DocumentChangedError,
    KeyExistsError,
    LeaseHeldError,
    LeaseLostError,
)
from ckptstore.io._engine import ParallelIO
from ckptstore.io._settings import IOSettings
from ckptstore.plugin._registry import get_registry
from ckptstore.protocol import WriterLease, open_node, read_blobs, read_lease
from ckptstore.records._layout import lease_key, parse_node_commit_key

RACERS = 6
NODE = "trainer_0"
T = TypeVar("T")


class ConditionalUploadGate:
    """Holds the first ``racers`` conditional uploads (``ifGenerationMatch``) of keys
    that ``chosen`` accepts until all of them arrived (so all were decided on the same
    view of the store), then lets them go one at a time in the order they arrived;
    later ones (a loser's retry) pass at once."""

    def __init__(self, racers: int, chosen: Callable[[str], bool]) -> None:
        self.barrier = threading.Barrier(racers)
        self.chosen = chosen
        self.held = 0
        self._done = [threading.Event() for _ in range(racers)]
        self._lock = threading.Lock()

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        original = GCSClient.request
        gate = self

        async def request(self: GCSClient, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            params = kwargs.get("params") or {}
            turn = None
            if "ifGenerationMatch" in params:
                turn = gate._take(str(params.get("name", "")))
            if turn is None:
                return await original(self, method, url, *args, **kwargs)
            await asyncio.to_thread(gate.barrier.wait, 60)
            if turn > 0:
                await asyncio.to_thread(gate._done[turn - 1].wait, 60)
            try:
                return await original(self, method, url, *args, **kwargs)
            finally:
                gate._done[turn].set()

        monkeypatch.setattr(GCSClient, "request", request)

    def _take(self, name: str) -> int | None:
        """The arrival index of an upload of ``name`` to hold, or ``None``."""
        with self._lock:
            if self.held >= self.barrier.parties or not self.chosen(name):
                return None
            self.held += 1
            return self.held - 1


def race(work: Callable[[int], T]) -> list[T | BaseException]:
    """``work(i)`` for each racer on its own thread: what each returned or raised."""

    def outcome(index: int) -> T | BaseException:
        try:
            return work(index)
        except Exception as error:
            return error

    with ThreadPoolExecutor(RACERS) as pool:
        return list(pool.map(outcome, range(RACERS)))


def winners(outcomes: list[Any]) -> list[int]:
    return [i for i, outcome in enumerate(outcomes) if not isinstance(outcome, BaseException)]


@pytest.fixture
def storage(gcs_strict_url: str) -> GCSPath:
    path = get_registry().open_path(gcs_strict_url)
    assert isinstance(path, GCSPath)
    return path


def test_racing_creates_of_one_key_have_exactly_one_winner(
    storage: GCSPath, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = ConditionalUploadGate(RACERS, lambda name: name.endswith("/doc"))
    gate.install(monkeypatch)
    outcomes = race(lambda i: storage.create_document("doc", b"writer %d" % i))
    assert gate.held == RACERS  # all of them decided on one view of the store
    (winner,) = winners(outcomes)
    assert all(
        isinstance(outcome, KeyExistsError) for i, outcome in enumerate(outcomes) if i != winner
    ), outcomes
    assert storage.get_document("doc") == b"writer %d" % winner


def test_racing_replaces_of_one_version_have_exactly_one_winner(
    storage: GCSPath, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage.create_document("doc", b"first")
    current = storage.get_versioned_document("doc")
    assert current is not None
    gate = ConditionalUploadGate(RACERS, lambda name: name.endswith("/doc"))
    gate.install(monkeypatch)
    outcomes = race(lambda i: storage.replace_document("doc", b"writer %d" % i, current[1]))
    assert gate.held == RACERS  # all of them decided on one view of the store
    (winner,) = winners(outcomes)
    assert all(
        isinstance(outcome, DocumentChangedError)
        for i, outcome in enumerate(outcomes)
        if i != winner
    ), outcomes
    assert storage.get_document("doc") == b"writer %d" % winner


def test_racing_saves_of_one_node_and_epoch_commit_exactly_one_whose_data_loads(
    gcs_strict_url: str, storage: GCSPath, monkeypatch: pytest.MonkeyPatch
) -> None:
    def commit_record(name: str) -> bool:
        return any(
            parse_node_commit_key(name[i + 1 :]) is not None
            for i in range(len(name))
            if name[i] == "/"
        )

    gate = ConditionalUploadGate(RACERS, commit_record)
    gate.install(monkeypatch)
    values = [np.full(1000, float(i)) for i in range(RACERS)]

    def save(index: int) -> None:
        session = LocalSession()
        session.workspace(NODE)["w"] = values[index]
        manager = CheckpointManager(gcs_strict_url, NODE, "npz")
        session.run(manager.init([NODE]))
        session.run(manager.save(3))

    outcomes = race(save)
    assert gate.held == RACERS  # every writer reached its commit record's create
    (winner,) = winners(outcomes)
    for i, outcome in enumerate(outcomes):
        if i != winner:  # typed; the commit record's create-once refused it
            assert isinstance(outcome, (AlreadyCommittedError, KeyExistsError)), repr(outcome)
    manifest = open_node(storage, NODE, 3)
    db_type = get_registry().db_type("npz")
    loaded = read_blobs(storage, manifest, ["w"], db_type, ParallelIO(IOSettings()))["w"]
    np.testing.assert_array_equal(loaded, values[winner])


def test_racing_takes_of_one_lease_leave_exactly_one_holder(
    storage: GCSPath, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = lease_key(NODE)
    gate = ConditionalUploadGate(RACERS, lambda name: name.endswith(key))
    gate.install(monkeypatch)
    leases = [WriterLease(storage, [NODE], ttl=30, heartbeat=False) for _ in range(RACERS)]
    outcomes = race(lambda i: leases[i].acquire())
    assert gate.held == RACERS  # all of them decided on one view of the store
    (winner,) = winners(outcomes)
    assert all(
        isinstance(outcome, LeaseHeldError) for i, outcome in enumerate(outcomes) if i != winner
    ), outcomes
    holder = read_lease(storage, NODE)
    assert holder is not None
    assert holder.token == leases[winner].token
    leases[winner].release()


def test_a_renewal_racing_a_takeover_of_one_generation_leaves_exactly_one_holder(
    storage: GCSPath, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The holder renews (``ifGenerationMatch=<generation>``) while a new job, whose
    clock says the lease expired, takes it over from the same generation. Whichever
    upload the store takes first, the takeover ends up holding the lease (its clock
    finds even a renewed lease expired), the holder's renewal never overwrites it, and
    the holder learns it lost the lease, typed."""
    key = lease_key(NODE)
    holder = WriterLease(storage, [NODE], ttl=30, heartbeat=False)
    holder.acquire()
    later = WriterLease(storage, [NODE], ttl=30, heartbeat=False, clock=lambda: time.time() + 3600)
    gate = ConditionalUploadGate(2, lambda name: name.endswith(key))
    gate.install(monkeypatch)
    with ThreadPoolExecutor(2) as pool:
        renewal = pool.submit(holder.renew)
        takeover = pool.submit(later.acquire)
        renewed = renewal.exception(timeout=120)
        taken = takeover.exception(timeout=120)
    assert gate.held == 2  # both conditional uploads raced from one generation
    assert taken is None, repr(taken)
    assert renewed is None or isinstance(renewed, LeaseLostError), repr(renewed)
    current = read_lease(storage, NODE)
    assert current is not None
    assert current.token == later.token
    assert current.generation == holder.generations[NODE] + 1
    with pytest.raises(LeaseLostError):
        holder.renew()
    with pytest.raises(LeaseLostError):
        holder.verify()  # what the commit step checks: the old holder commits nothing
    later.release()
