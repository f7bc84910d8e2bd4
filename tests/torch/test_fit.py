"""Restoring into objects that do not fit the stored state (a layer changed size, a
model converted to another dtype) is refused before any object is changed, naming the
tensor and both shapes or dtypes; the checkpoint is not called corrupt."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from ckptstore import CorruptCheckpointError  # noqa: E402
from ckptstore.errors import RestoreMismatchError  # noqa: E402
from ckptstore.torch import restore, save  # noqa: E402
from ckptstore.tree import save_tree  # noqa: E402


def stepped(model: torch.nn.Module) -> torch.optim.Optimizer:
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(4, model.in_features)).sum().backward()
    optimizer.step()
    return optimizer


def snapshot(obj: torch.nn.Module | torch.optim.Optimizer) -> str:
    return repr(obj.state_dict())


@pytest.fixture
def saved(tmp_path: Path) -> str:
    """Epoch 1: a Linear(2, 2) and its Adam optimizer after one step."""
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 2)
    save(str(tmp_path), 1, model=model, optimizer=stepped(model))
    return str(tmp_path)


def test_a_model_whose_layer_changed_size_is_refused_naming_the_tensor(saved: str) -> None:
    model = torch.nn.Linear(3, 2)
    optimizer = stepped(model)
    before = snapshot(model), snapshot(optimizer)
    with pytest.raises(RestoreMismatchError) as raised:
        restore(saved, model=model, optimizer=optimizer)
    error = raised.value
    assert isinstance(error, ValueError)
    assert not isinstance(error, CorruptCheckpointError)
    assert error.tensor == "model/weight"
    assert "'model/weight'" in str(error)
    assert "the checkpoint holds shape (2, 2)" in str(error)
    assert "the object restored into has shape (2, 3)" in str(error)
    assert (snapshot(model), snapshot(optimizer)) == before


def test_a_fresh_optimizer_of_a_resized_model_is_refused_before_the_old_shape_is_kept(
    saved: str,
) -> None:
    """Restored alone, a new optimizer has no state to compare with: its parameters
    are (torch's ``Optimizer.load_state_dict`` would keep the stale 2x2 ``exp_avg``)."""
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters())
    with pytest.raises(RestoreMismatchError) as raised:
        restore(saved, optimizer=optimizer)
    assert raised.value.tensor == "optimizer/state/#0/exp_avg"
    assert "shape (2, 2)" in str(raised.value)
    assert "a parameter of shape (2, 3)" in str(raised.value)
    assert optimizer.state_dict()["state"] == {}


def test_an_optimizer_over_other_parameters_is_refused(saved: str) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    with pytest.raises(RestoreMismatchError, match=r"\[2\] parameters.*\[4\] parameters"):
        restore(saved, optimizer=torch.optim.Adam(model.parameters()))


def test_a_model_converted_to_another_dtype_is_refused_naming_both(saved: str) -> None:
    model = torch.nn.Linear(2, 2).double()
    before = snapshot(model)
    with pytest.raises(RestoreMismatchError) as raised:
        restore(saved, model=model)
    assert raised.value.tensor == "model/weight"
    assert "dtype torch.float32" in str(raised.value)
    assert "dtype torch.float64" in str(raised.value)
    assert snapshot(model) == before


def test_objects_that_fit_are_restored(saved: str) -> None:
    torch.manual_seed(1)
    model = torch.nn.Linear(2, 2)
    optimizer = stepped(model)  # state to compare with, of the same shapes
    assert restore(saved, model=model, optimizer=optimizer) == 1
    fresh = torch.nn.Linear(2, 2)
    assert restore(saved, model=fresh, optimizer=torch.optim.Adam(fresh.parameters())) == 1
    assert torch.equal(fresh.weight, model.weight)


def test_a_lazy_module_takes_its_shape_from_the_checkpoint(saved: str) -> None:
    model = torch.nn.LazyLinear(2)
    assert restore(saved, model=model) == 1
    assert model.weight.shape == (2, 2)


def test_arrays_saved_with_save_tree_are_not_restored_as_tensors(tmp_path: Path) -> None:
    save_tree(str(tmp_path), 1, {"model": {"weight": np.zeros((2, 2), np.float32)}}, node="torch")
    with pytest.raises(RestoreMismatchError, match="a numpy array of float32") as raised:
        restore(str(tmp_path), model=torch.nn.Linear(2, 2))
    assert raised.value.tensor == "model/weight"
