"""A stateful property test of the whole save/resume life cycle on local disk
(hypothesis ``RuleBasedStateMachine``).

Two jobs share one checkpoint root: the main job (node ``trainer_0``) and a second
writer (node ``trainer_1``, its own job). Hypothesis picks a format, then a sequence
of: saves (sync or async, with or without retention), a job run in a child process
killed with SIGKILL at its K-th mutating file-system call (a real process per kill),
the second writer saving while the main job saves, ``ckptstore gc`` acting as the
main job, the catalog damaged or deleted, and an operator's ``ckptstore lease break``
while the main job holds its lease (TTL 2 s) in the middle of an epoch, and a job
on another host name (a child in its own UTS namespace) killed, whose lease the next
job, retried every 0.25 s, takes once it expired.

After every step:

* every epoch ever reported committed (``JobRunner.committed_epochs``) is still
  committed and loads exactly (bytes equal), unless its own job's retention or gc
  deleted it (and then only an epoch older than the ones that policy keeps);
* every epoch with a commit record, reported or not (a killed job may have committed
  one before it died), loads exactly;
* the resume of each job picks its newest committed epoch.

Budget: the default run is small (``max_examples`` and ``stateful_step_count`` below,
10 to 20 s on a 2-core machine). ``CKPTSTORE_LONG_TESTS=1`` runs the long one
(30 examples of up to 25 steps; see docs/guarantees.md for its last measured run);
``CKPTSTORE_STATEFUL_EXAMPLES=N`` sets the number of examples.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import hypothesis.strategies as st
import pytest
from fault_helpers import NODE, assert_loads_exactly, build_job, committed, resume_epoch
from hypothesis import HealthCheck, event, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from ckptstore import (
    JobRunner,
    KeepLast,
    LeaseHeldError,
    LeaseLostError,
    LocalSession,
    MultiNodeCheckpointManager,
)
from ckptstore.builtin._json_catalog import CATALOG_DIR
from ckptstore.cli import main as cli_main
from ckptstore.plugin._registry import get_registry
from ckptstore.protocol import committed_nodes

LONG = os.environ.get("CKPTSTORE_LONG_TESTS") == "1"
OTHER = "trainer_1"
SALTS = {NODE: 0, OTHER: 1}
CHILD = Path(__file__).with_name("stateful_child.py")
LEASE_TTL = 2.0


def cli(*argv: str) -> int:
    """Run the ``ckptstore`` command line in this process, its output swallowed."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return cli_main(list(argv))


class CheckpointLifecycle(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="ckptstore-stateful-"))
        self.root = str(self.directory / "ckpt")
        self.db_type = "npz"
        self.reported: dict[str, set[int]] = {NODE: set(), OTHER: set()}
        self.retired: dict[str, set[int]] = {NODE: set(), OTHER: set()}

    def teardown(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)

    # -- helpers --------------------------------------------------------------------

    def present(self, node: str) -> set[int]:
        """The epochs with a commit record of ``node``."""
        storage = get_registry().open_path(self.root)
        return {epoch for epoch in committed(self.root) if committed_nodes(storage, epoch, [node])}

    def target(self, node: str, more: int) -> int:
        newest = resume_epoch(self.root, node)
        return (0 if newest is None else newest) + more

    def runner(self, node: str, epochs: int, **options: object) -> JobRunner:
        manager = MultiNodeCheckpointManager(self.root, self.db_type, "json")
        before_train = options.pop("before_train", None)
        job = build_job(epochs, SALTS[node], node, before_train)  # type: ignore[arg-type]
        return JobRunner(job, manager, lease_ttl=LEASE_TTL, retry_backoff=0, **options)  # type: ignore[arg-type]

    def train(self, node: str, runner: JobRunner) -> None:
        try:
            runner.train(LocalSession())
        finally:
            self.reported[node] |= set(runner.committed_epochs)

    def retire(self, node: str, keep: int) -> None:
        """After retention keeping ``keep`` epochs ran for ``node``: what it deleted
        must be older than what it kept; those epochs are allowed to be gone."""
        present = self.present(node)
        gone = self.reported[node] - self.retired[node] - present
        for epoch in gone:
            newer = [kept for kept in present if kept > epoch]
            assert len(newer) >= keep, f"{node} epoch {epoch} deleted, kept only {sorted(present)}"
        self.retired[node] |= gone

    # -- rules ----------------------------------------------------------------------

    @initialize(db_type=st.sampled_from(["zarr", "npz", "lmdb"]))
    def choose_format(self, db_type: str) -> None:
        self.db_type = db_type

    @rule(
        more=st.integers(1, 3),
        async_save=st.booleans(),
        keep=st.sampled_from([None, None, 1, 2]),
    )
    def save(self, more: int, async_save: bool, keep: int | None) -> None:
        retention = None if keep is None else KeepLast(keep)
        runner = self.runner(
            NODE, self.target(NODE, more), async_save=async_save, retention=retention
        )
        self.train(NODE, runner)
        if keep is not None:
            self.retire(NODE, keep)

    def run_child(self, kill_at: int, async_save: bool, host: str | None = None) -> bool:
        """Run the main job in a child process killed at its ``kill_at``-th mutating
        call (on another host name: ``host``); whether it was killed."""
        mode = "async" if async_save else "sync"
        command = [sys.executable, str(CHILD), self.root, self.db_type]
        command += [str(self.target(NODE, 2)), str(kill_at), mode]
        if host is not None:  # its own UTS namespace: its lease names another host
            command = ["unshare", "--uts", "--", "sh", "-c", f'hostname {host} && exec "$@"', "-"]
            command += [sys.executable, str(CHILD), self.root, self.db_type]
            command += [str(self.target(NODE, 2)), str(kill_at), mode]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(CHILD.parent), *sys.path])}
        result = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
        if result.returncode == 0:  # K was past the run's last call: it finished
            line = result.stdout.strip().splitlines()[-1]
            assert line.startswith("committed="), result.stdout
            self.reported[NODE] |= {int(epoch) for epoch in line[10:].split(",") if epoch}
            return False
        if host is not None and result.returncode == 1 and "LeaseHeldError" in result.stderr:
            # the lease of a job killed on this host just before: from another host its
            # death cannot be seen, so the child rightly waits for it to expire
            event("a job on another host refused by a dead job's lease")
            return False
        assert result.returncode == -9, result.stderr  # SIGKILL, nothing else
        event("a child job killed with SIGKILL")
        return True

    @rule(kill_at=st.integers(1, 80), async_save=st.booleans())
    def killed_save(self, kill_at: int, async_save: bool) -> None:
        self.run_child(kill_at, async_save)

    @rule(kill_at=st.integers(1, 80))
    def killed_on_another_host_then_its_lease_expires(self, kill_at: int) -> None:
        """A job on another host dies: its lease can only expire. The next job, retried
        as a scheduler would, gets in within one TTL of the kill (plus its own run)."""
        killed = self.run_child(kill_at, False, host="ckptstore-other-host")
        died = time.monotonic()
        refusals = 0
        while True:
            runner = self.runner(NODE, self.target(NODE, 1))
            try:
                self.train(NODE, runner)
            except LeaseHeldError as error:
                refused = str(error)
            else:
                event(f"a dead holder on another host: refused {min(refusals, 1)}+ times, then in")
                break
            refusals += 1
            assert killed, f"only the killed job can still hold the lease: {refused}"
            assert "ckptstore-other-host" in refused
            assert time.monotonic() - died < LEASE_TTL + 5, "the dead job's lease never expired"
            time.sleep(0.25)  # a scheduler retrying the job; the lease expires by time

    @rule(more=st.integers(1, 2))
    def second_writer_saves_meanwhile(self, more: int) -> None:
        other = self.runner(OTHER, self.target(OTHER, more), retention=KeepLast(2))
        main = self.runner(NODE, self.target(NODE, 1))
        with ThreadPoolExecutor(2) as pool:  # both jobs at once; .result() raises here
            for future in [
                pool.submit(self.train, OTHER, other),
                pool.submit(self.train, NODE, main),
            ]:
                future.result()
        self.retire(OTHER, 2)

    @rule(keep=st.integers(1, 3))
    def gc_as_the_main_job(self, keep: int) -> None:
        exists = Path(self.root).is_dir()  # gc of nothing: exit 4, not found
        assert cli("gc", self.root, "--keep-last", str(keep), "--node", NODE) == (
            0 if exists else 4
        )
        self.retire(NODE, keep)

    @rule(delete=st.booleans())
    def damage_the_catalog(self, delete: bool) -> None:
        catalog = Path(self.root, CATALOG_DIR)
        if delete:
            shutil.rmtree(catalog, ignore_errors=True)
            return
        for directory, _, names in os.walk(catalog):
            for name in names:
                Path(directory, name).write_bytes(b"\x00garbage{")

    @rule()
    def lease_broken_while_the_main_job_trains(self) -> None:
        newest = resume_epoch(self.root, NODE)
        holding, go = threading.Event(), threading.Event()

        def pause() -> None:
            if not holding.is_set():
                holding.set()
                assert go.wait(60), "the test never let the job go on"

        runner = self.runner(NODE, self.target(NODE, 2), before_train=pause)
        outcome: list[BaseException | None] = []

        def run() -> None:
            try:
                self.train(NODE, runner)
                outcome.append(None)
            except BaseException as error:  # checked below, in the test's thread
                outcome.append(error)

        thread = threading.Thread(target=run)
        thread.start()
        try:
            assert holding.wait(60), "the job never started training"
            assert cli("lease", "break", self.root, "--node", NODE) == 0
        finally:
            go.set()
            thread.join()
        (error,) = outcome
        assert isinstance(error, LeaseLostError), repr(error)
        # the epoch it was training when the lease was broken is never committed by it
        epoch = 1 if newest is None else newest + 1
        assert epoch not in runner.committed_epochs
        assert epoch not in self.present(NODE)

    # -- what must always hold ------------------------------------------------------

    @invariant()
    def nothing_committed_is_lost_and_everything_committed_loads(self) -> None:
        for node, salt in SALTS.items():
            present = self.present(node)
            missing = self.reported[node] - self.retired[node] - present
            assert not missing, f"{node}: reported committed, now gone: {sorted(missing)}"
            for epoch in sorted(present):
                assert_loads_exactly(self.root, epoch, self.db_type, salt, node)
            assert resume_epoch(self.root, node) == (max(present) if present else None)


pytestmark = pytest.mark.timeout(0 if LONG else 300)  # the long run takes its time

CheckpointLifecycle.TestCase.settings = settings(
    max_examples=int(os.environ.get("CKPTSTORE_STATEFUL_EXAMPLES", 30 if LONG else 5)),
    stateful_step_count=25 if LONG else 8,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TestCheckpointLifecycle = CheckpointLifecycle.TestCase
