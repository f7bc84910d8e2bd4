"""Every crash state of a save and its commit, explored (ALICE/CrashMonkey style).

A two-node job commits epoch 1, then a rerun saves epoch 2 while every file-system call
(local disk) or every bucket-changing request (S3 on moto) is recorded. Each crash state
the recording implies (:mod:`crash_states.states`; on S3: the first ``k`` requests) is
laid out afresh, ``ckptstore verify`` judges epochs 1 and 2, and a rerun of the job
resumes (:func:`crash_states.scenario.check_state`): it must resume from an intact epoch
(never start over, never lose epoch 2 once the save returned), end with exactly epoch
2's state, and agree with ``verify``.

The default run checks a seeded sample of the small shape's states per format
(``CKPTSTORE_CRASH_STATES_SEED``, default 0). ``CKPTSTORE_LONG_TESTS=1`` checks every
distinct state, up to 16 tear points per write, of the small shape and the larger mix,
on local disk (zarr, npz, lmdb) and S3 (zarr, npz; LMDB works only on local disk): see
docs/design.md, "Crash states, explored".
"""

from __future__ import annotations

import os
from pathlib import Path

import boto3
import pytest
from crash_states.explore import Report, explore_local, explore_s3

from ckptstore.testing import MotoServer

LONG = os.environ.get("CKPTSTORE_LONG_TESTS") == "1"
SEED = int(os.environ.get("CKPTSTORE_CRASH_STATES_SEED", "0"))
LOCAL_SAMPLE = 25
S3_SAMPLE = 4
SHAPES = ["small", "mix"] if LONG else ["small"]


def _checked(report: Report, budget: int) -> None:
    print(report.summary())
    assert report.failures == [], "\n".join(report.failures[:20])
    assert report.checked == (report.distinct if LONG else min(budget, report.distinct))
    # both outcomes were met: the sample reaches crashes before and after the commit
    assert set(report.resumed) == {1, 2}


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("db_type", ["zarr", "npz", "lmdb"])
def test_every_local_crash_state_resumes_an_intact_epoch(
    db_type: str, shape: str, tmp_path: Path, scratch: Path
) -> None:
    report = explore_local(
        tmp_path,
        scratch,
        db_type,
        shape,
        budget=None if LONG else LOCAL_SAMPLE,
        seed=SEED,
        every_tear=LONG,
    )
    _checked(report, LOCAL_SAMPLE)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("db_type", ["zarr", "npz"] if LONG else ["zarr"])  # lmdb: local only
def test_every_s3_request_cut_resumes_an_intact_epoch(
    db_type: str,
    shape: str,
    tmp_path: Path,
    s3_server: MotoServer,
    s3_url: str,
) -> None:
    bucket = s3_url.removeprefix("s3://").split("/")[0]
    client = boto3.client("s3", endpoint_url=s3_server.endpoint_url)
    report = explore_s3(
        tmp_path, client, bucket, db_type, shape, budget=None if LONG else S3_SAMPLE, seed=SEED
    )
    _checked(report, S3_SAMPLE)
