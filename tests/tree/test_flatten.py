"""Flattening trees: every key round-trips through blob names, every scalar exactly."""

from __future__ import annotations

import json
import math
from collections import OrderedDict

import numpy as np
import pytest

from ckptstore.errors import CorruptCheckpointError, UnsupportedBlobError
from ckptstore.records import validate_blob_name
from ckptstore.tree import decode_segment, encode_segment, flatten, unflatten

AWKWARD_KEYS: list[str | int] = [
    "",
    ".",
    "..",
    ".hidden",
    "a/b",
    "%",
    "%25",
    "#1",
    "#tree",
    "x y",
    "é✓",
    "\x00\x1f\x7f",
    "back\\slash",
    "layer1.weight",
    0,
    -3,
    10**30,
]


@pytest.mark.parametrize("key", AWKWARD_KEYS)
def test_every_key_round_trips_as_a_valid_blob_segment(key: str | int) -> None:
    segment = encode_segment(key)
    assert validate_blob_name(f"prefix/{segment}") == f"prefix/{segment}"
    assert "/" not in segment
    assert decode_segment(segment) == key
    assert type(decode_segment(segment)) is type(key)


def test_distinct_keys_get_distinct_segments() -> None:
    segments = [encode_segment(key) for key in [*AWKWARD_KEYS, "0", "-3"]]
    assert len(set(segments)) == len(segments)


def test_readable_names_stay_readable() -> None:
    arrays, _ = flatten(
        {"model": {"layer1.weight": np.zeros(1)}, "opt": {"state": {0: np.ones(1)}}}
    )
    assert sorted(arrays) == ["model/layer1.weight", "opt/state/#0"]


def test_a_tree_round_trips_structure_scalars_and_arrays_exactly() -> None:
    tree = OrderedDict(
        a={"b": np.arange(6, dtype=np.int16).reshape(2, 3), 7: [1, -(2**70), None, True, "s"]},
        t=(0.1, math.inf, -0.0, (np.float32(1.5),)),
        n=float("nan"),
    )
    arrays, spec = flatten(tree)
    spec = json.loads(json.dumps(spec))  # the spec survives JSON
    out = unflatten(spec, arrays)
    assert isinstance(out, OrderedDict)
    assert list(out) == ["a", "t", "n"]
    assert out["a"][7] == [1, -(2**70), None, True, "s"]
    assert type(out["a"][7][3]) is bool
    assert out["t"][:2] == (0.1, math.inf)
    assert math.copysign(1, out["t"][2]) == -1
    assert type(out["t"][3][0]) is np.float32
    assert out["t"][3][0] == 1.5
    assert math.isnan(out["n"])
    assert np.array_equal(out["a"]["b"], tree["a"]["b"])
    assert out["a"]["b"].dtype == np.int16


def test_arrays_are_flattened_without_a_copy() -> None:
    weights = np.ones(1000, dtype=np.float32)
    arrays, _ = flatten({"w": weights})
    assert np.shares_memory(arrays["w"], weights)


def test_bfloat16_and_float8_round_trip_bit_exactly_as_unsigned_views() -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bits = np.arange(2**16, dtype=np.uint16)  # every bfloat16 pattern, NaNs included
    bf16 = bits.view(ml_dtypes.bfloat16)
    f8 = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)
    arrays, spec = flatten({"bf16": bf16, "f8": f8})
    assert arrays["bf16"].dtype == np.uint16
    assert np.shares_memory(arrays["bf16"], bf16)
    out = unflatten(json.loads(json.dumps(spec)), arrays)
    assert out["bf16"].dtype == ml_dtypes.bfloat16
    assert out["f8"].dtype == ml_dtypes.float8_e4m3fn
    assert np.array_equal(out["bf16"].view(np.uint16), bits)
    assert np.array_equal(out["f8"].view(np.uint8), np.arange(256, dtype=np.uint8))


@pytest.mark.parametrize(
    "bad", [{"k": object()}, {1.5: 1}, {True: 1}, {"a": np.array([None], dtype=object)}]
)
def test_what_would_need_pickle_is_refused(bad: dict[object, object]) -> None:
    with pytest.raises(UnsupportedBlobError):
        flatten(bad)


def test_a_refused_array_is_named_by_its_key_path_not_its_dtype() -> None:
    with pytest.raises(UnsupportedBlobError) as raised:
        flatten({"layer": {"names": np.array(["a", None], dtype=object)}})
    assert raised.value.blob == "layer/names"
    assert "blob 'layer/names'" in str(raised.value)
    assert "its dtype |O" in str(raised.value)


def test_an_adapter_error_is_raised_again_naming_the_blob() -> None:
    class Refusing:
        kind = "refusing"

        def to_numpy(self, value: object) -> tuple[np.ndarray, str] | None:
            raise UnsupportedBlobError("float32", "not today")

        def from_numpy(self, array: np.ndarray, dtype: str) -> object:
            raise AssertionError("not called")

    with pytest.raises(UnsupportedBlobError) as raised:
        flatten({"w": np.ones(2)}, Refusing())
    assert raised.value.blob == "w"
    assert raised.value.reason == "not today (float32)"


@pytest.mark.parametrize(
    "spec",
    [
        {"format": "other", "version": 1, "root": {"t": "scalar", "v": 1}},
        {"format": "ckptstore.tree", "version": 1, "root": {"t": "eval", "v": "1+1"}},
        {"format": "ckptstore.tree", "version": 1, "root": {"t": "scalar", "v": [1]}},
        {"format": "ckptstore.tree", "version": 1, "root": {"t": "int", "v": "1e9"}},
        {
            "format": "ckptstore.tree",
            "version": 1,
            "root": {"t": "dict", "k": [["float", 1.0]], "v": [None]},
        },
        {"format": "ckptstore.tree", "version": 1, "root": {"t": "array", "b": "gone", "d": "<f4"}},
        {"format": "ckptstore.tree", "version": 1, "root": {"t": "array", "b": "x", "d": "<f8"}},
        *(  # forged dtypes over stored bytes: never objects, void, structs or a reinterpretation
            {"format": "ckptstore.tree", "version": 1, "root": {"t": "array", "b": "u", "d": d}}
            for d in ("O", "|V8", "<M8[s]", "<f8", "(2,)<u4", "<u4,<u4", "f" * 100, "what")
        ),
    ],
)
def test_a_malformed_spec_is_corrupt_not_a_crash(spec: dict[str, object]) -> None:
    with pytest.raises(CorruptCheckpointError, match="tree spec"):
        unflatten(spec, {"x": np.zeros(2, dtype=np.float32), "u": np.zeros(2, dtype=np.uint64)})


def test_a_deeply_nested_spec_is_refused() -> None:
    root: dict[str, object] = {"t": "scalar", "v": None}
    for _ in range(500):
        root = {"t": "list", "v": [root]}
    with pytest.raises(CorruptCheckpointError):
        unflatten({"format": "ckptstore.tree", "version": 1, "root": root}, {})


def test_an_unflattened_tree_is_freed_without_a_garbage_collection() -> None:
    import gc
    import weakref

    arrays, spec = flatten({"a": {"w": np.ones(3)}, "b": [np.zeros(2)]})
    tree = unflatten(spec, arrays)
    freed = weakref.ref(arrays["a/w"])
    gc.disable()  # no cycle may hold the loaded arrays (a GiB each, in a load)
    try:
        del tree, arrays
        assert freed() is None
    finally:
        gc.enable()
