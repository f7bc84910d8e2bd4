"""Record a save, then check every crash state it implies (or a seeded sample).

    CKPTSTORE_LONG_TESTS=1 python -m pytest tests/crash_states -q -p no:cacheprovider

runs every state of every format and store; the default test run checks every state
of the small shape and a seeded sample of the larger one.
"""

from __future__ import annotations

import pickle
import random
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crash_states.recorder import Recording
from crash_states.s3_requests import Request, copy_objects, empty_bucket, read_objects, replay
from crash_states.scenario import SHAPES, check_state, environment_for_child
from crash_states.states import CrashState, build, distinct_states, sample, snapshot

CHILD = "crash_states.record_child"


@dataclass
class Report:
    """What one exploration checked and found."""

    label: str
    operations: int = 0
    states: int = 0
    distinct: int = 0
    checked: int = 0
    resumed: dict[int | None, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> str:
        resumed = dict(sorted(self.resumed.items(), key=str))
        return (
            f"{self.label}: {self.operations} operations, {self.distinct} distinct crash "
            f"states, {self.checked} checked (resumed from {resumed}), "
            f"{len(self.failures)} failing, {self.seconds:.1f} s"
        )


def record(directory: Path, db_type: str, shape: str) -> tuple[Recording, Path]:
    """Commit epoch 1 in ``directory/run``, snapshot it, record the save of epoch 2."""
    root = directory / "run"
    env = environment_for_child()
    _child(env, "setup", str(root), db_type, shape)
    snapshot(root, directory / "before")
    _child(env, "record", str(root), db_type, shape, str(directory / "recording.pkl"))
    with open(directory / "recording.pkl", "rb") as file:
        recording: Recording = pickle.load(file)
    return recording, directory / "before"


def tree_bytes(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root``: a file's bytes, ``None`` for a directory."""
    return {
        str(path.relative_to(root)): None if path.is_dir() else path.read_bytes()
        for path in root.rglob("*")
    }


def unrecorded(recording: Recording, before: Path, after: Path, scratch: Path) -> list[str]:
    """The paths where replaying every recorded operation on ``before`` does not give
    ``after`` (the tree the recorded run left): what the recorder missed."""
    build(recording, CrashState(len(recording.ops), "process"), before).write_to(scratch, before)
    replayed, real = tree_bytes(scratch), tree_bytes(after)
    shutil.rmtree(scratch)
    return sorted(p for p in replayed.keys() | real.keys() if replayed.get(p, 0) != real.get(p, 0))


def explore_local(
    directory: Path,
    scratch: Path,
    db_type: str,
    shape: str,
    *,
    budget: int | None,
    seed: int = 0,
    every_tear: bool = False,
) -> Report:
    """Record the save of ``db_type`` in ``shape`` in ``directory`` (a real disk: the
    ``O_DIRECT`` path is taken) and check its crash states, each laid out in ``scratch``
    (memory: the checks' own fsyncs are free)."""
    started = time.monotonic()
    report = Report(f"{db_type}/{shape} on local disk")
    recording, before = record(directory, db_type, shape)
    report.operations = len(recording.ops)
    missed = unrecorded(recording, before, directory / "run", scratch / "replayed")
    if missed:
        report.failures.append(f"the recording misses changes to {missed}")
    states = distinct_states(recording, before, every_tear=every_tear)
    report.distinct = len(states)
    chosen = sample(states, budget, seed)
    for number, state in enumerate(chosen):
        target = scratch / f"state-{number}"
        build(recording, state, before).write_to(target, before)
        outcome = check_state(
            str(target), db_type, SHAPES[shape], completed=state.prefix == len(recording.ops)
        )
        report.checked += 1
        report.resumed[outcome.resumed_from] = report.resumed.get(outcome.resumed_from, 0) + 1
        if outcome.problems:
            report.failures.append(f"{state.describe(recording)}: {'; '.join(outcome.problems)}")
        shutil.rmtree(target)
    report.seconds = time.monotonic() - started
    return report


def explore_s3(
    directory: Path,
    client: Any,
    base_bucket: str,
    db_type: str,
    shape: str,
    *,
    budget: int | None,
    seed: int = 0,
) -> Report:
    """Record the save of ``db_type`` in ``shape`` to ``s3://base_bucket/run`` (the
    ``AWS_*`` variables name the server; ``client``: boto3's, on it), then check the
    crash after each request: a fresh bucket holding the objects from before the save
    and the first ``k`` requests (:mod:`crash_states.s3_requests`)."""
    started = time.monotonic()
    report = Report(f"{db_type}/{shape} on S3 (moto)")
    url = f"s3://{base_bucket}/run"
    out = directory / "requests.pkl"
    env = environment_for_child()
    _child(env, "setup", url, db_type, shape)
    before = read_objects(client, base_bucket)
    _child(env, "record", url, db_type, shape, str(out))
    with open(out, "rb") as file:
        requests: list[Request] = pickle.load(file)
    report.operations = report.distinct = len(requests) + 1
    cuts = list(range(len(requests) + 1))
    if budget is not None and budget < len(cuts):
        cuts = sorted([*random.Random(seed).sample(cuts[:-1], budget - 1), cuts[-1]])
    for cut in cuts:
        bucket = f"{base_bucket}-cut-{cut}"
        copy_objects(client, before, bucket)
        replay(client, requests[:cut], bucket)
        outcome = check_state(
            f"s3://{bucket}/run", db_type, SHAPES[shape], completed=cut == len(requests)
        )
        report.checked += 1
        report.resumed[outcome.resumed_from] = report.resumed.get(outcome.resumed_from, 0) + 1
        if outcome.problems:
            last = requests[cut - 1].describe() if cut else "nothing"
            report.failures.append(
                f"crash after request {cut} ({last}): {'; '.join(outcome.problems)}"
            )
        empty_bucket(client, bucket)
    report.seconds = time.monotonic() - started
    return report


def _child(env: dict[str, str], *args: str) -> None:
    subprocess.run([sys.executable, "-m", CHILD, *args], check=True, env=env)
