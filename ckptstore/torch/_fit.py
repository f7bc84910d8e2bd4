"""Whether stored state fits the objects it is about to be restored into: every stored
tensor must have the shape and dtype of the tensor it replaces, so that a model whose
layer changed size since the save is refused (naming the tensor) before any object
is changed, instead of raising half-way or keeping stale optimizer state.

Two comparisons, both before any ``load_state_dict``:

* each tensor of the object's current ``state_dict()`` against the stored tensor at the
  same key path (a module's parameters and buffers; an optimizer's state once it has
  stepped);
* for torch's own optimizers (``torch.optim``), whose state may still be empty, each
  stored per-parameter state tensor that has the parameter's shape by construction
  (``exp_avg``, ``momentum_buffer``...) against the parameter it will belong to, and
  the number of parameters in each group.

Example::

    >>> import torch
    >>> stored = {"weight": torch.zeros(2, 2), "bias": torch.zeros(2)}
    >>> check_fits("model", torch.nn.Linear(2, 2), stored)  # fits: returns quietly
    >>> check_fits("model", torch.nn.Linear(3, 2), stored)
    Traceback (most recent call last):
    ckptstore.errors.RestoreMismatchError: cannot restore tensor 'model/weight': ...
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import chain

import numpy as np
import torch

from ckptstore.errors import RestoreMismatchError
from ckptstore.tree import encode_segment

__all__ = ["PARAMETER_SHAPED", "check_fits"]

PARAMETER_SHAPED = frozenset(
    {
        "acc_delta",
        "ax",
        "exp_avg",
        "exp_avg_sq",
        "exp_inf",
        "grad_avg",
        "max_exp_avg_sq",
        "momentum_buffer",
        "prev",
        "square_avg",
        "step_size",
        "sum",
        "variance",
    }
)
"""Per-parameter state of ``torch.optim``'s optimizers created with the parameter's
shape (``torch.zeros_like(p)``...); the rest (``step``, Adafactor's ``row_var``...)
has other shapes."""


def check_fits(name: str, obj: object, stored: object) -> None:
    """Raise :class:`~ckptstore.errors.RestoreMismatchError` if ``stored`` (the state saved
    under ``name``) holds a tensor of another shape or dtype than the one of ``obj`` it
    would replace."""
    state_dict = getattr(obj, "state_dict", None)
    if callable(state_dict):
        _compare(state_dict(), stored, name)
    if isinstance(obj, torch.optim.Optimizer) and type(obj).__module__.startswith("torch.optim"):
        _check_optimizer(name, obj, stored)


def _compare(current: object, stored: object, path: str) -> None:
    if isinstance(current, torch.Tensor) and isinstance(stored, np.ndarray | np.generic):
        raise RestoreMismatchError(  # a numpy leaf: saved with save_tree, not ckptstore.torch
            path, f"a numpy array of {stored.dtype}", f"a tensor of {current.dtype}"
        )
    if isinstance(current, torch.Tensor) and isinstance(stored, torch.Tensor):
        if torch.nn.parameter.is_lazy(current):
            return  # an uninitialized lazy module takes its shape from what it loads
        if current.shape != stored.shape:
            raise RestoreMismatchError(
                path, f"shape {tuple(stored.shape)}", f"shape {tuple(current.shape)}"
            )
        if current.dtype != stored.dtype:
            raise RestoreMismatchError(path, f"dtype {stored.dtype}", f"dtype {current.dtype}")
    elif isinstance(current, Mapping) and isinstance(stored, Mapping):
        for key in current:
            if key in stored and isinstance(key, str | int) and not isinstance(key, bool):
                _compare(current[key], stored[key], f"{path}/{encode_segment(key)}")
    elif isinstance(current, list | tuple) and isinstance(stored, list | tuple):
        for index, (mine, theirs) in enumerate(zip(current, stored, strict=False)):
            _compare(mine, theirs, f"{path}/#{index}")


def _check_optimizer(name: str, optimizer: torch.optim.Optimizer, stored: object) -> None:
    """The stored per-parameter state against the parameters it will belong to (as
    ``Optimizer.load_state_dict`` pairs them: in order, group by group)."""
    if not isinstance(stored, Mapping):
        return
    groups, state = stored.get("param_groups"), stored.get("state")
    if (
        not isinstance(groups, list)
        or not isinstance(state, Mapping)
        or not all(
            isinstance(group, dict) and isinstance(group.get("params"), list) for group in groups
        )
    ):
        return  # not an optimizer's state dict: load_state_dict says so
    stored_sizes = [len(group["params"]) for group in groups]
    sizes = [len(group["params"]) for group in optimizer.param_groups]
    if stored_sizes != sizes:
        raise RestoreMismatchError(
            f"{name}/param_groups",
            f"parameter groups of {stored_sizes} parameters",
            f"parameter groups of {sizes} parameters",
        )
    ids = chain.from_iterable(group["params"] for group in groups)
    parameters = chain.from_iterable(group["params"] for group in optimizer.param_groups)
    for index, parameter in zip(ids, parameters, strict=True):
        entry = state.get(index) if isinstance(index, int) else None
        if not isinstance(entry, Mapping):
            continue
        for key, value in entry.items():
            if (
                key in PARAMETER_SHAPED
                and isinstance(value, torch.Tensor)
                and value.shape != parameter.shape
                and not torch.nn.parameter.is_lazy(parameter)
            ):
                raise RestoreMismatchError(
                    f"{name}/state/{encode_segment(index)}/{encode_segment(key)}",
                    f"shape {tuple(value.shape)}",
                    f"a parameter of shape {tuple(parameter.shape)}",
                )
