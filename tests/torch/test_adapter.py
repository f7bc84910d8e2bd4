"""Tensors of every dtype round-trip bit-exactly, zero-copy where numpy has the dtype."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from ckptstore.torch import TorchAdapter, load_state, save_state  # noqa: E402
from ckptstore.tree import flatten, load_tree, unflatten  # noqa: E402

DTYPES = [
    "bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
    "float16", "bfloat16", "float32", "float64", "complex32", "complex64", "complex128",
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu",
]  # fmt: skip


def every_bit_pattern(dtype: torch.dtype, shape: tuple[int, ...] = (3, 5)) -> torch.Tensor:
    """A tensor of ``dtype`` filled with random bytes (NaN payloads, subnormals...)."""
    width = torch.empty(0, dtype=dtype).element_size()
    raw = np.random.default_rng(7).integers(0, 256, size=(*shape, width), dtype=np.uint8)
    if dtype == torch.bool:
        raw = raw % 2
    tensor = torch.from_numpy(raw.copy())
    return tensor.view(dtype).reshape(shape)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    def raw(t: torch.Tensor) -> bytes:
        return bytes(t.contiguous().reshape(-1).view(torch.uint8).numpy())

    return a.dtype == b.dtype and a.shape == b.shape and raw(a) == raw(b)


@pytest.mark.parametrize("name", DTYPES)
def test_every_dtype_round_trips_bit_exactly(name: str) -> None:
    tensor = every_bit_pattern(getattr(torch, name))
    arrays, spec = flatten({"t": tensor, "scalar": tensor[0, 0]}, TorchAdapter())
    out = unflatten(json.loads(json.dumps(spec)), arrays, TorchAdapter())
    assert same_bits(out["t"], tensor)
    assert same_bits(out["scalar"], tensor[0, 0])
    assert out["scalar"].dim() == 0


@pytest.mark.parametrize("name", ["float32", "bfloat16", "float8_e4m3fn", "int64"])
def test_saving_views_the_tensor_memory_without_a_copy(name: str) -> None:
    tensor = every_bit_pattern(getattr(torch, name), (256,))
    arrays, _ = flatten({"t": tensor}, TorchAdapter())
    assert arrays["t"].ctypes.data == tensor.data_ptr()


def test_a_loaded_tensor_shares_the_memory_read() -> None:
    array = np.arange(8, dtype=np.float32)
    tensor = TorchAdapter().from_numpy(array, "float32")
    assert isinstance(tensor, torch.Tensor)
    assert tensor.data_ptr() == array.ctypes.data


@pytest.mark.parametrize("db_type", ["zarr", "npz"])
def test_every_dtype_round_trips_through_storage(tmp_path: Path, db_type: str) -> None:
    state = {name: every_bit_pattern(getattr(torch, name)) for name in DTYPES}
    save_state(str(tmp_path), 1, state, db_type=db_type)
    out = load_state(str(tmp_path), db_type=db_type)
    for name in DTYPES:
        assert same_bits(out[name], state[name]), name


def test_without_torch_a_torch_checkpoint_reads_as_numpy(tmp_path: Path) -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bf16 = torch.tensor([1.5, -2.0], dtype=torch.bfloat16)
    save_state(str(tmp_path), 0, {"w": torch.arange(3.0), "bf": bf16})
    out = load_tree(str(tmp_path), node="torch")  # no adapter: plain numpy
    assert isinstance(out, dict)
    assert out["w"].dtype == np.float32
    assert out["w"].tolist() == [0.0, 1.0, 2.0]
    assert out["bf"].dtype == ml_dtypes.bfloat16
    assert out["bf"].astype(np.float32).tolist() == [
        1.5,
        -2,
    ]


def test_gpu_only_and_sparse_tensors_are_refused_loudly() -> None:
    from ckptstore.errors import UnsupportedBlobError

    with pytest.raises(UnsupportedBlobError) as raised:
        flatten({"layer": {"s": torch.eye(3).to_sparse()}}, TorchAdapter())
    assert raised.value.blob == "layer/s"  # the key path, not the dtype 'float32'
    assert "blob 'layer/s'" in str(raised.value)
    assert "torch.sparse_coo float32 tensor" in str(raised.value)
    assert ".to_dense()" in str(raised.value)


def test_a_stored_dtype_this_torch_lacks_is_named_with_its_blob() -> None:
    from ckptstore.errors import UnsupportedBlobError

    spec = {
        "format": "ckptstore.tree",
        "version": 1,
        "root": {"t": "array", "b": "model/w", "k": "torch", "d": "float99", "s": False},
    }
    with pytest.raises(UnsupportedBlobError) as raised:
        unflatten(spec, {"model/w": np.zeros(2, np.uint8)}, TorchAdapter())
    assert raised.value.blob == "model/w"
    assert "this torch has no dtype float99" in str(raised.value)
