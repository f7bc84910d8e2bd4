"""The example jobs of Caffe2's checkpoint_test.py, ported: a reader over ten records
0..9 adding three of them per epoch to a running total that starts at 100, and the
one-epoch job of its download-group test."""

from __future__ import annotations

from functools import partial

import numpy as np

from ckptstore import Job, Node, Task, Workspace, epoch_limiter
from ckptstore.execution import TaskOutput

EXPECTED_TOTALS = [103, 115, 136, 145]


def _init(ws: Workspace, *, node: str) -> None:
    ws[f"{node}/dataset"] = np.arange(10, dtype=np.int64)
    ws[f"{node}/cursor"] = np.array(0, dtype=np.int64)
    ws[f"{node}/total"] = np.array([100], dtype=np.int64)


def _read_three(ws: Workspace, *, node: str) -> None:
    dataset, cursor, total = ws[f"{node}/dataset"], ws[f"{node}/cursor"], ws[f"{node}/total"]
    finished = False
    for _ in range(3):  # ReaderWithLimit(num_iter=3)
        if int(cursor) >= len(dataset):
            finished = True
            break
        total += dataset[int(cursor)]
        cursor += 1
    ws[f"{node}/data_finished"] = np.array(finished)


def build_pipeline(node_id: int) -> TaskOutput:
    """Add trainer_<node_id>'s tasks to the current job; returns its total's output."""
    job = Job.current()
    node = f"trainer_{node_id}"
    with Node(node):
        with job.init_group:
            init = Task(partial(_init, node=node), outputs=[f"{node}/total"], name=f"{node}/init")
        epoch = Task(
            partial(_read_three, node=node), outputs=[f"{node}/data_finished"], name=f"{node}/read"
        )
        job.add_stop_condition(epoch.outputs()[0])
    return init.outputs()[0]


def total_fetcher(node_id: int = 0) -> Task:
    """A standalone step-less task whose output is trainer_<node_id>'s total."""
    with Node(f"trainer_{node_id}"):
        return Task(outputs=[f"trainer_{node_id}/total"], name="output_fetcher")


def _init_download_inputs(ws: Workspace) -> None:
    for name in ("input1", "input2", "output", "download_result"):
        ws[name] = np.ones(8, dtype=np.float32)


def build_download_job() -> Job:
    """Caffe2's ``test_download_group_simple`` job on node ``trainer:0``: four float32
    blobs of eight ones; one epoch sets ``output = input1 + input2`` (and a ``scratch``
    blob its private group drops); the download group copies ``output`` to
    ``download_result``."""
    with Job() as job, Node("trainer:0"):
        with job.init_group:
            Task(_init_download_inputs, name="param_init")
        Task(lambda ws: ws.update(output=ws["input1"] + ws["input2"], scratch=1), name="epoch")
        with job.download_group:
            Task(lambda ws: ws.update(download_result=ws["output"].copy()), name="download")
        epoch_limiter(job, 1)
    return job
