"""ckptstore.torch.save/restore over several roots, fastest first."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from ckptstore import torch as ckpt_torch  # noqa: E402


def test_save_reaches_every_root_and_restore_survives_losing_the_fast_one(tmp_path: Path) -> None:
    roots = [str(tmp_path / "fast"), str(tmp_path / "durable")]
    model = torch.nn.Linear(3, 2)
    ckpt_torch.save(roots, 4, model=model)
    assert ckpt_torch.load_state(roots[1], 4)["model"]["weight"].equal(model.weight)
    shutil.rmtree(roots[0])
    fresh = torch.nn.Linear(3, 2)
    assert ckpt_torch.restore(roots, model=fresh) == 4
    assert fresh.weight.equal(model.weight)
