"""Train a one-node job to local disk then S3 (the AWS_* environment points at the
server), the S3 copy running in the background; the test kills this process mid-copy.

    python tier_copy_child.py LOCAL_ROOT S3_ROOT EPOCHS
"""

from __future__ import annotations

import sys

import numpy as np

from ckptstore import Job, JobRunner, LocalSession, Node, Task, epoch_limiter
from ckptstore.checkpoint import CheckpointManager


def main() -> None:
    local, s3, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with Job() as job, Node("trainer_0"):
        with job.init_group:
            Task(lambda ws: ws.update(w=np.zeros(4096), b=np.zeros(3)))
        Task(lambda ws: ws["w"].__iadd__(1))
        epoch_limiter(job, epochs)
    manager = CheckpointManager([local, s3], "trainer_0", "zarr", "json")
    JobRunner(job, manager).train(LocalSession())


if __name__ == "__main__":
    main()
