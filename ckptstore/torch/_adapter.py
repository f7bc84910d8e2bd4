"""Torch tensors as tree leaves: zero-copy numpy views in, zero-copy tensors out.

Tensors numpy supports (bool, ints, uints, float16/32/64, complex64/128) are stored as
``tensor.numpy()`` views. The others (bfloat16, the float8 types, complex32) are viewed
as unsigned integers of the same width, still without a copy, and the true dtype is
recorded in the tree's spec, so they round-trip bit-exactly whatever the format stores
natively. Loaded tensors are on the CPU and share memory with the arrays read.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch

from ckptstore.errors import UnsupportedBlobError

__all__ = ["TorchAdapter"]

_SAME_WIDTH = {
    1: (torch.uint8, np.dtype(np.uint8)),
    2: (torch.int16, np.dtype(np.uint16)),
    4: (torch.int32, np.dtype(np.uint32)),
    8: (torch.int64, np.dtype(np.uint64)),
}
_DTYPES = {
    str(value).removeprefix("torch."): value
    for value in vars(torch).values()
    if isinstance(value, torch.dtype)
}


class TorchAdapter:
    """The :class:`~ckptstore.tree.ArrayAdapter` of ``torch.Tensor`` leaves."""

    kind = "torch"

    def to_numpy(self, value: object) -> tuple[np.ndarray[Any, Any], str] | None:
        """A numpy view of a tensor's memory (on the CPU) and its dtype's name."""
        if not isinstance(value, torch.Tensor):
            return None
        name = str(value.dtype).removeprefix("torch.")
        if value.layout != torch.strided or value.is_quantized:
            raise UnsupportedBlobError(
                name,
                f"it is a {'quantized' if value.is_quantized else value.layout} {name} tensor; "
                "only dense (torch.strided) tensors are supported: convert it first "
                "(.to_dense(), .dequantize())",
            )
        tensor = value.detach().cpu().resolve_conj().resolve_neg()
        try:
            return tensor.numpy(), name
        except TypeError:
            pass
        width = tensor.element_size()
        if width not in _SAME_WIDTH:
            raise UnsupportedBlobError(name, f"tensors of {width}-byte {name} are not supported")
        as_int, as_uint = _SAME_WIDTH[width]
        return tensor.view(as_int).numpy().view(as_uint), name

    def from_numpy(self, array: np.ndarray[Any, Any], dtype: str) -> object:
        """A CPU tensor of ``dtype`` sharing ``array``'s memory."""
        wanted = _DTYPES.get(dtype)
        if wanted is None:
            raise UnsupportedBlobError(
                dtype, f"this torch has no dtype {dtype[:40]} (saved by a newer one?)"
            )
        if not array.flags.writeable:
            array = array.copy()
        if array.dtype.kind == "u" and wanted.itemsize == array.dtype.itemsize:
            array = array.view(np.dtype(f"i{array.dtype.itemsize}"))  # any torch can take it
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # complex32 is "experimental"
            tensor = torch.from_numpy(array)
        if tensor.dtype != wanted:
            if tensor.element_size() != wanted.itemsize:
                raise UnsupportedBlobError(
                    dtype, f"it is stored as {array.dtype}, another width than {dtype[:40]}"
                )
            tensor = tensor.view(wanted)
        return tensor
