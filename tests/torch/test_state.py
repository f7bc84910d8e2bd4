"""A model and its Adam optimizer: saved after a few steps, restored into fresh objects,
training continues exactly as if never interrupted."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from ckpt_helpers import files_under  # noqa: E402

from ckptstore import (  # noqa: E402
    AlreadyCommittedError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
)
from ckptstore.errors import (  # noqa: E402
    BlobNotFoundError,
    CheckpointKindError,
    InvalidEpochError,
    JobConfigurationError,
)
from ckptstore.torch import load_state, restore, save, save_state  # noqa: E402
from ckptstore.tree import save_tree  # noqa: E402

README = Path(__file__).parents[2] / "README.md"


def make() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16),
        torch.nn.BatchNorm1d(16),  # buffers and an int64 step counter
        torch.nn.ReLU(),
        torch.nn.Linear(16, 1),
    )
    model[3].to(torch.bfloat16)  # a bfloat16 layer
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(32, 8, generator=generator)
        hidden = model[2](model[1](model[0](x)))
        loss = model[3](hidden.to(torch.bfloat16)).float().pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def bits(state: object) -> object:
    """A state dict with every tensor replaced by its dtype, shape and raw bytes."""
    if isinstance(state, torch.Tensor):
        return (
            state.dtype,
            tuple(state.shape),
            bytes(state.contiguous().reshape(-1).view(torch.uint8).numpy()),
        )
    if isinstance(state, dict):
        return {key: bits(value) for key, value in state.items()}
    if isinstance(state, list | tuple):
        return type(state)(bits(value) for value in state)
    return state


def test_model_and_adam_round_trip_and_training_continues_identically(tmp_path: Path) -> None:
    model, optimizer = make()
    train(model, optimizer, 3, seed=1)
    save(str(tmp_path), 3, model=model, optimizer=optimizer)

    fresh_model, fresh_optimizer = make()
    assert restore(str(tmp_path), model=fresh_model, optimizer=fresh_optimizer) == 3
    assert bits(fresh_model.state_dict()) == bits(model.state_dict())
    assert bits(fresh_optimizer.state_dict()) == bits(optimizer.state_dict())

    train(model, optimizer, 4, seed=2)
    train(fresh_model, fresh_optimizer, 4, seed=2)
    assert bits(fresh_model.state_dict()) == bits(model.state_dict())
    assert bits(fresh_optimizer.state_dict()) == bits(optimizer.state_dict())


def test_the_loaded_state_has_the_same_structure_and_types(tmp_path: Path) -> None:
    model, optimizer = make()
    train(model, optimizer, 2, seed=1)
    save(str(tmp_path), 2, model=model, optimizer=optimizer)
    state = load_state(str(tmp_path))
    saved = optimizer.state_dict()
    assert state["optimizer"]["param_groups"] == saved["param_groups"]  # floats, tuples, None
    assert isinstance(state["optimizer"]["param_groups"][0]["betas"], tuple)
    assert list(state["optimizer"]["state"]) == list(saved["state"])  # int keys
    assert list(state["model"]) == list(model.state_dict())
    assert state["model"]._metadata == model.state_dict()._metadata  # module versions
    assert state["model"]["1.num_batches_tracked"].dtype == torch.int64
    assert all(t.device.type == "cpu" for t in state["model"].values())


def test_restoring_a_name_that_was_not_saved_changes_nothing(tmp_path: Path) -> None:
    model, optimizer = make()
    save(str(tmp_path), 0, model=model)
    other, _ = make()
    before = bits(other.state_dict())
    with pytest.raises(BlobNotFoundError, match="optimizer"):
        restore(str(tmp_path), model=other, optimizer=optimizer)
    assert bits(other.state_dict()) == before


def test_the_readme_torch_example_runs_in_five_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = README.read_text()
    match = re.search(r"<!-- torch-example -->\n```python\n(.*?)```", text, re.S)
    assert match, "README.md lost its torch example"
    code = match.group(1)
    assert (
        len([line for line in code.splitlines() if line.strip() and not line.startswith("#")]) <= 5
    )
    monkeypatch.chdir(tmp_path)
    model, optimizer = make()
    train(model, optimizer, 1, seed=1)
    namespace: dict[str, object] = {"model": model, "optimizer": optimizer, "epoch": 1}
    exec(compile(code, "README.md", "exec"), namespace)
    assert namespace["epoch"] == 1
    assert np.array_equal(
        load_state(str(tmp_path / "ckpt"))["model"]["0.weight"].numpy(),
        model.state_dict()["0.weight"].numpy(),
    )


@pytest.mark.parametrize("epoch", ["1", 4.0, True, -1, 2**63], ids=repr)
def test_an_epoch_that_is_not_one_is_refused_naming_it_and_nothing_is_written(
    tmp_path: Path, epoch: object
) -> None:
    model, _ = make()
    with pytest.raises(InvalidEpochError, match=r"^epoch=") as raised:
        save(str(tmp_path / "ckpt"), epoch, model=model)  # type: ignore[arg-type]
    assert isinstance(raised.value, ValueError)
    assert not isinstance(raised.value, CorruptCheckpointError)
    assert raised.value.argument == "epoch"
    assert "non-negative integer" in str(raised.value)
    assert not (tmp_path / "ckpt").exists()
    save(str(tmp_path / "ckpt"), 0, model=model)
    written = files_under(tmp_path / "ckpt")
    for call in (load_state, lambda url, e: restore(url, e, model=model)):
        with pytest.raises(InvalidEpochError, match=r"^epoch="):
            call(str(tmp_path / "ckpt"), epoch)
    assert files_under(tmp_path / "ckpt") == written


def test_a_numpy_integer_epoch_is_an_int_epoch(tmp_path: Path) -> None:
    model, _ = make()
    save(str(tmp_path), np.int64(3), model=model)  # type: ignore[arg-type]
    assert restore(str(tmp_path), np.uint8(3), model=model) == 3  # type: ignore[arg-type]
    assert (tmp_path / "torch.3").is_dir()
    assert type(restore(str(tmp_path), model=model)) is int


def test_a_committed_epoch_is_write_once_unless_overwrite(tmp_path: Path) -> None:
    """As a manager's: a second save of an epoch raises AlreadyCommittedError and
    leaves the first intact; ``overwrite=True`` replaces it."""
    model, optimizer = make()
    save(str(tmp_path), 1, model=model)
    first = bits(load_state(str(tmp_path), 1))
    train(model, optimizer, 1, seed=3)
    with pytest.raises(AlreadyCommittedError, match="overwrite=True") as raised:
        save(str(tmp_path), 1, model=model, optimizer=optimizer)
    assert raised.value.epoch == 1
    assert bits(load_state(str(tmp_path), 1)) == first
    save(str(tmp_path), 1, model=model, optimizer=optimizer, overwrite=True)
    assert set(load_state(str(tmp_path), 1)) == {"model", "optimizer"}
    with pytest.raises(AlreadyCommittedError):
        save_state(str(tmp_path), 1, {"step": 1})
    save_state(str(tmp_path), 1, {"step": 1}, overwrite=True)
    assert load_state(str(tmp_path), 1) == {"step": 1}


def test_restoring_from_nothing_says_to_save_with_the_torch_api(tmp_path: Path) -> None:
    model, _ = make()
    for call in (lambda: restore(str(tmp_path), model=model), lambda: load_state(str(tmp_path))):
        with pytest.raises(CheckpointNotFoundError, match=r"ckptstore\.torch\.save") as raised:
            call()
        assert "save_tree" not in str(raised.value)
        assert raised.value.node == "torch"


def test_a_tree_that_is_not_a_dict_of_states_is_a_wrong_use_not_corruption(
    tmp_path: Path,
) -> None:
    save_tree(str(tmp_path), 5, [1, 2], node="torch")
    with pytest.raises(CheckpointKindError, match="holds a list, not a dict of states") as raised:
        load_state(str(tmp_path))
    assert isinstance(raised.value, ValueError)
    assert not isinstance(raised.value, CorruptCheckpointError)
    assert raised.value.checkpoint == "torch.5"


def test_an_incremental_save_stores_a_frozen_layer_once_and_restores_bit_for_bit(
    tmp_path: Path,
) -> None:
    torch.manual_seed(0)
    frozen = torch.nn.Linear(512, 1024)  # 2 MiB of weights: into the chunk store
    head = torch.nn.Linear(4, 2)
    root = str(tmp_path)
    save(root, 1, incremental=True, frozen=frozen, head=head)
    with torch.no_grad():
        head.weight += 1
    save(root, 2, incremental=True, frozen=frozen, head=head)
    assert len(list((tmp_path / "_ckptstore" / "chunks").iterdir())) == 1
    fresh_frozen, fresh_head = torch.nn.Linear(512, 1024), torch.nn.Linear(4, 2)
    restore(root, 2, frozen=fresh_frozen, head=fresh_head)
    assert torch.equal(fresh_frozen.weight, frozen.weight)
    assert torch.equal(fresh_head.weight, head.weight)


@pytest.mark.usefixtures("write_watched")
def test_parameters_nothing_wrote_to_are_not_read_again(tmp_path: Path, hashed: list[int]) -> None:
    """Without frozen_keys=, the kernel's write watch (Linux 6.7+) tells the save which
    tensors' memory was written since the previous save."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.Linear(2048, 4))
    model[0].requires_grad_(False)  # the frozen base: 16 MiB of weights, four chunks
    optimizer = torch.optim.Adam(p for p in model.parameters() if p.requires_grad)
    root = str(tmp_path)
    save(root, 1, incremental=True, model=model, optimizer=optimizer)
    model(torch.ones(1, 2048)).sum().backward()
    optimizer.step()  # changes the head only
    hashed.clear()
    save(root, 2, incremental=True, model=model, optimizer=optimizer)
    assert len(hashed) == 1  # one chunk of the base, as a check
    with torch.no_grad():
        model[0].weight[:8] += 1  # the first chunk of the base
    hashed.clear()
    save(root, 3, incremental=True, model=model, optimizer=optimizer)
    assert len(hashed) == 2  # that chunk, and the check of another
    fresh = torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.Linear(2048, 4))
    restore(root, 3, model=fresh)
    pairs = zip(fresh.parameters(), model.parameters(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)


def test_frozen_keys_name_parameters_whose_bytes_are_not_read_again(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.Linear(1024, 4))
    model[0].requires_grad_(False)  # the frozen base: 2 MiB of weights, one chunk
    frozen = [("model", n) for n, p in model.named_parameters() if not p.requires_grad]
    root = str(tmp_path)
    save(root, 1, incremental=True, model=model)
    with torch.no_grad():
        model[1].weight += 1
    save(root, 2, incremental=True, frozen_keys=frozen, model=model)
    fresh = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.Linear(1024, 4))
    restore(root, 2, model=fresh)
    pairs = zip(fresh.parameters(), model.parameters(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)
    with torch.no_grad():
        model[0].weight += 1  # the promise broken: its one chunk is checked at each save
    with pytest.raises(JobConfigurationError, match="declared frozen"):
        save(root, 3, incremental=True, frozen_keys=frozen, model=model)
