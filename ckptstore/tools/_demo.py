"""The demo training job: one-vs-rest logistic regression on synthetic data, one class
per node, checkpointed every epoch and resumed automatically.

Each node ``trainer_<k>`` holds its own copy of the (seeded) data set and learns to
tell class ``k`` from the rest with mini-batch SGD; the driver combines the nodes'
scores to report accuracy. Shuffling depends only on the epoch number, so a resumed
run reaches exactly the weights an uninterrupted one does.

Example::

    >>> from ckptstore.tools._demo import DemoConfig, run_demo
    >>> result = run_demo(DemoConfig(directory="demo", epochs=2, nodes=2))
    ckptstore demo: 2 nodes, logistic regression, checkpoints in demo (zarr on local disk)
    starting from scratch
    epoch   0  initial state  | checkpoint saved: 2 nodes, ...
    epoch   1/2  loss ...
    epoch   2/2  loss ...
    done: trained to epoch 2, accuracy ...
    >>> result.resumed_from, result.last_epoch
    (None, 2)
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from functools import partial
from typing import TextIO

import numpy as np

from ckptstore._types import Array
from ckptstore.checkpoint import JobRunner, MultiNodeCheckpointManager
from ckptstore.errors import JobConfigurationError
from ckptstore.execution import Job, LocalSession, Node, Task, TaskOutput, Workspace
from ckptstore.plugin import get_registry, hookimpl
from ckptstore.protocol import WriterLease, committed_epochs, retract_epoch
from ckptstore.records import NodeStats

__all__ = ["DemoConfig", "DemoResult", "build_demo_job", "run_demo"]

FEATURES = 32
SAMPLES = 4096
BATCH = 128
LEARNING_RATE = 0.005
SEED = 20261122


@dataclass(frozen=True)
class DemoConfig:
    """What ``ckptstore demo`` runs: where, how many epochs and nodes, which format."""

    directory: str = "./ckptstore-demo"
    epochs: int = 6
    nodes: int = 3
    db_type: str = "zarr"
    fresh: bool = False


@dataclass(frozen=True)
class DemoResult:
    """How a demo run ended: ``resumed_from`` is the epoch it restored and went on from
    (``None``: from scratch)."""

    resumed_from: int | None
    last_epoch: int
    accuracy: float
    weights: dict[str, Array]


def _init_node(ws: Workspace, *, node: str, label: int, classes: int) -> None:
    rng = np.random.default_rng(SEED)
    centers = rng.normal(0.0, 0.35, size=(classes, FEATURES)).astype(np.float32)
    labels = rng.integers(0, classes, size=SAMPLES)
    features = centers[labels] + rng.normal(0.0, 1.0, size=(SAMPLES, FEATURES)).astype(np.float32)
    ws[f"{node}/features"] = features.astype(np.float32)
    ws[f"{node}/targets"] = (labels == label).astype(np.float32)
    ws[f"{node}/labels"] = labels.astype(np.int64)
    ws[f"{node}/weights"] = np.zeros(FEATURES, dtype=np.float32)
    ws[f"{node}/bias"] = np.zeros((), dtype=np.float32)
    ws[f"{node}/epoch"] = np.zeros((), dtype=np.int64)


def _train_epoch(ws: Workspace, *, node: str, target_epochs: int) -> None:
    features, targets = ws[f"{node}/features"], ws[f"{node}/targets"]
    weights, bias, epoch = ws[f"{node}/weights"], ws[f"{node}/bias"], ws[f"{node}/epoch"]
    epoch += 1
    order = np.random.default_rng(SEED + int(epoch)).permutation(SAMPLES)
    for start in range(0, SAMPLES, BATCH):
        batch = order[start : start + BATCH]
        x, y = features[batch], targets[batch]
        p = 1.0 / (1.0 + np.exp(-(x @ weights + bias)))
        error = (p - y).astype(np.float32)
        weights -= LEARNING_RATE * (x.T @ error) / len(batch)
        bias -= np.float32(LEARNING_RATE * error.mean())
    p = 1.0 / (1.0 + np.exp(-(features @ weights + bias)))
    eps = 1e-7
    loss = -np.mean(targets * np.log(p + eps) + (1 - targets) * np.log(1 - p + eps))
    ws[f"{node}/loss"] = np.array(loss, dtype=np.float32)
    ws[f"{node}/done"] = np.array(int(epoch) >= target_epochs)


def build_demo_job(config: DemoConfig) -> tuple[Job, dict[str, TaskOutput]]:
    """The demo job, and the outputs the progress report reads (loss, weights...)."""
    if config.epochs < 1 or config.nodes < 2:
        raise JobConfigurationError("the demo needs --epochs >= 1 and --nodes >= 2")
    outputs: dict[str, TaskOutput] = {}
    with Job() as job:
        for label in range(config.nodes):
            node = f"trainer_{label}"
            with Node(node):
                with job.init_group:
                    Task(
                        partial(_init_node, node=node, label=label, classes=config.nodes),
                        name=f"{node}/init",
                    )
                task = Task(
                    partial(_train_epoch, node=node, target_epochs=config.epochs),
                    outputs=[f"{node}/loss", f"{node}/done"],
                    name=f"{node}/train",
                )
                loss, done = task.outputs()
                job.add_stop_condition(done)
                reader = Task(
                    outputs=[
                        f"{node}/weights",
                        f"{node}/bias",
                        f"{node}/features",
                        f"{node}/labels",
                    ],
                    name=f"{node}/read",
                )
                outputs[f"{node}/loss"] = loss
                for output in reader.outputs():
                    assert output.blob_name is not None
                    outputs[output.blob_name] = output
    return job, outputs


class _Progress:
    """A ``ckptstore_report`` plugin printing one line per committed epoch."""

    def __init__(self, config: DemoConfig, outputs: dict[str, TaskOutput], out: TextIO) -> None:
        self.config = config
        self.outputs = outputs
        self.out = out
        self.accuracy = 0.0

    def accuracy_now(self) -> float:
        nodes = [f"trainer_{k}" for k in range(self.config.nodes)]
        features = self.outputs[f"{nodes[0]}/features"].fetch()
        labels = self.outputs[f"{nodes[0]}/labels"].fetch_array()
        scores = np.stack(
            [
                features @ self.outputs[f"{n}/weights"].fetch_array()
                + self.outputs[f"{n}/bias"].fetch_array()
                for n in nodes
            ],
            axis=1,
        )
        return float(np.mean(np.argmax(scores, axis=1) == labels))

    @hookimpl
    def ckptstore_report(self, action_name: str, stats: dict[str, NodeStats]) -> None:
        if not stats:
            return
        first = next(iter(stats.values()))
        size = sum(s.nbytes for s in stats.values())
        slowest = max(s.duration_ns for s in stats.values()) / 1e6
        where = f"{len(stats)} nodes, {size / 1024:.0f} KiB, {slowest:.1f} ms"
        if action_name == "checkpoint_save" and first.epoch > 0:
            losses = [
                float(self.outputs[f"trainer_{k}/loss"].fetch_array())
                for k in range(self.config.nodes)
            ]
            self.accuracy = self.accuracy_now()
            print(
                f"epoch {first.epoch:3d}/{self.config.epochs}  loss {np.mean(losses):.4f}  "
                f"accuracy {self.accuracy:6.2%}  | checkpoint saved: {where}",
                file=self.out,
            )
        elif action_name == "checkpoint_save":
            print(f"epoch   0  initial state  | checkpoint saved: {where}", file=self.out)
        elif action_name == "checkpoint_load":
            print(f"resumed from epoch {first.epoch}  | checkpoint loaded: {where}", file=self.out)
        elif action_name == "checkpoint_save_failed":
            print(f"epoch {first.epoch:3d}: checkpoint FAILED: {first.error}", file=self.out)


def _start_over(directory: str, nodes: list[str]) -> None:
    """``--fresh``: uncommit every epoch first, then delete the checkpoints; refused
    (:class:`~ckptstore.errors.LeaseHeldError`) while another job writes there."""
    storage = get_registry().open_path(directory)
    with WriterLease(storage, nodes):
        for epoch in committed_epochs(storage):
            retract_epoch(storage, epoch, nodes)
        shutil.rmtree(directory, ignore_errors=True)


def run_demo(config: DemoConfig, out: TextIO | None = None) -> DemoResult | None:
    """Train (or resume) the demo job; None if it had already reached ``epochs``.
    Progress goes to ``out`` (the current ``sys.stdout`` by default)."""
    out = sys.stdout if out is None else out
    job, outputs = build_demo_job(config)
    if config.fresh:
        _start_over(config.directory, [str(node) for node in job.nodes_to_checkpoint()])
    manager = MultiNodeCheckpointManager(config.directory, config.db_type, metadata_handler="json")
    nodes = job.nodes_to_checkpoint()
    manager.set_params(nodes)
    resume = manager.get_resume_from_epoch_id(None)
    print(
        f"ckptstore demo: {config.nodes} nodes, logistic regression, checkpoints in "
        f"{config.directory} ({config.db_type} on local disk)",
        file=out,
    )
    if resume is not None and resume >= config.epochs:
        print(
            f"already trained to epoch {resume} (the last complete checkpoint); pass "
            f"--epochs {resume + 4} to train further or --fresh to start over",
            file=out,
        )
        return None
    print("starting from scratch" if resume is None else f"resuming after epoch {resume}", file=out)
    progress = _Progress(config, outputs, out)
    registry = get_registry()
    registry.register(progress, name="ckptstore-demo-progress")
    try:
        session = LocalSession()
        runner = JobRunner(job, manager, overwrite=config.fresh)
        last = runner.train(session)
        weights = {
            name: output.fetch_array().copy()
            for name, output in outputs.items()
            if name.endswith("/weights")
        }
        accuracy = progress.accuracy_now()  # the model trained, saved or not
    finally:
        registry.unregister(progress)
    failed = [failure.epoch for failure in runner.save_failures]
    resumed = runner.resumed_from_epoch  # where it did resume (an older epoch if one was damaged)
    print(
        "done: "
        + ("" if resumed is None else f"resumed from epoch {resumed}, ")
        + f"trained to epoch {last}, accuracy {accuracy:.2%}. "
        + (
            f"The checkpoints of epoch(s) {failed} failed (see above)."
            if failed
            else "Run again to see it resume; --epochs N to train further, --fresh to start over."
        ),
        file=out,
    )
    return DemoResult(resumed, last, accuracy, weights)
