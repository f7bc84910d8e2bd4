"""A second (or first) writer process for tests/test_concurrent_writers.py.

    python writer_child.py MODE URL NODE [EPOCHS...]

Every mode prints ``ready`` once set up and waits for a line on stdin before it writes
(so two processes start writing together without sleeps), then prints what it did.

* ``job``: a JobRunner job on NODE (a writer lease is taken at startup); after the
  first epoch it prints ``holding`` and waits for another line before finishing.
* ``save``: a CheckpointManager on NODE saves each listed epoch and prints ``saved``.
* ``commit``: only the commit step, NODE's record for each listed epoch, back to back
  (the tightest race on an epoch's commit record); prints ``saved``.
"""

from __future__ import annotations

import sys

import numpy as np

from ckptstore import (
    CheckpointManager,
    Job,
    JobRunner,
    LocalSession,
    MultiNodeCheckpointManager,
    Node,
    Task,
    Workspace,
    epoch_limiter,
)


def wait_for_go() -> None:
    print("ready", flush=True)
    if not sys.stdin.readline():
        raise SystemExit("stdin closed before go")


def run_job(url: str, node: str) -> None:
    def step(ws: Workspace) -> None:
        ws["step"] = ws["step"] + 1
        if int(ws["step"][0]) == 1:
            print("holding", flush=True)
            sys.stdin.readline()

    with Job() as job, Node(node):
        with job.init_group:
            Task(lambda ws: ws.update(step=np.zeros(1, dtype=np.int64)), name="init")
        Task(step, name="step")
        epoch_limiter(job, 2)
    runner = JobRunner(job, MultiNodeCheckpointManager(url, "npz"))
    wait_for_go()
    print(f"done {runner.train(LocalSession())}", flush=True)


def save_epochs(url: str, node: str, epochs: list[int]) -> None:
    session = LocalSession()
    with Node(node):
        session.workspace(node)["w"] = np.arange(4.0)
    manager = CheckpointManager(url, node, "npz")
    session.run(manager.init([node]))
    wait_for_go()
    for epoch in epochs:
        session.workspace(node)["w"] = np.full(4, float(epoch))
        session.run(manager.save(epoch))
    print("saved", flush=True)


def commit_epochs(url: str, node: str, epochs: list[int]) -> None:
    from ckptstore.plugin._registry import get_registry
    from ckptstore.protocol import NodeCommit, commit_epoch

    storage = get_registry().open_path(url)
    wait_for_go()
    for epoch in epochs:
        commit_epoch(storage, epoch, [NodeCommit(node, epoch, "npz", 0, 0, 0, 0)])
    print("saved", flush=True)


def main() -> None:
    mode, url, node = sys.argv[1:4]
    if mode == "job":
        run_job(url, node)
    elif mode == "save":
        save_epochs(url, node, [int(e) for e in sys.argv[4:]])
    elif mode == "commit":
        commit_epochs(url, node, [int(e) for e in sys.argv[4:]])
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
