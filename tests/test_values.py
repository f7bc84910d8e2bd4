"""Every value round-trips bit for bit, or is refused clearly (issue 11, point 6).

The table: every plain numpy dtype in both byte orders, ml_dtypes' bfloat16, float8 and
int4 families, NaN payloads (signalling NaNs) and -0.0, and every layout (0-d, empty,
strided, transposed, Fortran-order, views), saved and loaded through the public API
(:class:`CheckpointManager` on local disk for zarr, zarr+zstd, npz and lmdb;
:class:`MultiNodeCheckpointManager` on S3 for zarr and npz, one checkpoint holding all
of them). Each comparison is of dtype (byte order included), shape and bytes.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from ckptstore import (
    CheckpointManager,
    Job,
    JobRunner,
    LocalSession,
    MultiNodeCheckpointManager,
    Node,
    Task,
    epoch_limiter,
)
from ckptstore.errors import InvalidNameError, UnsupportedBlobError
from ckptstore.formats._zarr_db import ZarrDB
from ckptstore.io import IOSettings
from ckptstore.protocol import _commit as protocol
from ckptstore.records import ML_DTYPES_INSTALL
from ckptstore.testing.fixtures import s3_server, s3_storage_options, s3_url

__all__ = ["s3_server", "s3_storage_options", "s3_url"]  # the fixtures this module uses

Array = np.ndarray[Any, Any]
NODE = "trainer_0"
SMALL_CHUNKS = IOSettings(chunk_bytes=4096)
"""Small chunks, so that the larger values span many of them."""

# -- the values ----------------------------------------------------------------------------

_SPECIAL_BITS = {
    # quiet and signalling NaNs with payloads, both signs; -0.0; infinities
    2: [0x7E00, 0x7C01, 0xFD55, 0x8000, 0x7C00, 0xFC00],
    4: [0x7FC00000, 0x7F800001, 0xFFA5A5A5, 0x80000000, 0x7F800000, 0xFF800000],
    8: [
        0x7FF8000000000000,
        0x7FF0000000000001,
        0xFFF5A5A5A5A5A5A5,
        0x8000000000000000,
        0x7FF0000000000000,
        0xFFF0000000000000,
    ],
}


def _bits(itemsize: int, count: int) -> Array:
    """``count`` deterministic elements of ``itemsize`` bytes covering every byte value."""
    data = (np.arange(count * itemsize, dtype=np.uint64) * 7919 + 13) % 251
    return data.astype(np.uint8)


def _native(dtype: np.dtype[Any]) -> np.dtype[Any]:
    return dtype.newbyteorder("=") if dtype.itemsize > 1 else dtype


def sample(dtype: Any, shape: tuple[int, ...] = (3, 5)) -> Array:
    """A deterministic array of ``dtype`` whose bytes differ element to element; floats
    and complex start with signalling/quiet NaN payloads, -0.0 and infinities."""
    dtype = np.dtype(dtype)
    native = _native(dtype)
    count = int(np.prod(shape))
    kind = native.kind
    if kind in "SU":
        text = [f"é{i}✓\x00x"[: native.itemsize // (4 if kind == "U" else 1)] for i in range(count)]
        if kind == "S":
            text = [t.encode("utf-8", "replace")[: native.itemsize] for t in text]
        array = np.array(text, dtype=native)
    elif kind == "b":
        array = (np.arange(count) % 3 == 0).astype(native)
    else:
        array = _bits(native.itemsize, count).view(native)
        if kind in "fc" and native.itemsize // (2 if kind == "c" else 1) in _SPECIAL_BITS:
            width = native.itemsize // (2 if kind == "c" else 1)
            special = np.array(_SPECIAL_BITS[width], dtype=f"u{width}")
            flat = array.view(f"u{width}")
            flat[: min(special.size, flat.size)] = special[: flat.size]
    array = array.reshape(shape)
    if native != dtype:  # the same values, stored the other way round, bit for bit
        array = array.byteswap().view(dtype)
    return array


def _both_orders(*names: str) -> list[np.dtype[Any]]:
    dtypes = []
    for name in names:
        dtype = np.dtype(name)
        dtypes.append(dtype.newbyteorder("<"))
        if dtype.itemsize > 1:
            dtypes.append(dtype.newbyteorder(">"))
    return dtypes


NUMPY_DTYPES = [
    np.dtype("?"),
    *_both_orders("i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8"),
    *_both_orders("f2", "f4", "f8", "c8", "c16"),
    *_both_orders(np.longdouble, np.clongdouble),
    np.dtype("S1"),
    np.dtype("S7"),
    *_both_orders("U1", "U5"),
    *_both_orders("M8[ns]", "M8[us]", "M8[s]", "M8[D]", "M8[25s]"),
    *_both_orders("m8[ns]", "m8[ms]", "m8[h]", "m8[W]"),
    np.dtype("M8").newbyteorder("="),  # no unit: numpy allocates these only native
    np.dtype("m8").newbyteorder("="),
]
"""Plain numpy dtypes; longdouble is stored as its raw bytes (its format is the
platform's; see docs/values.md)."""

ML_NAMES = [
    "bfloat16",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "float8_e4m3b11fnuz",
    "int4",
    "uint4",
    # newer ml_dtypes types, stored the same way
    "float8_e4m3",
    "float8_e3m4",
    "float8_e8m0fnu",
    "float6_e2m3fn",
    "float6_e3m2fn",
    "float4_e2m1fn",
    "int2",
    "uint2",
]
ML_DTYPES = [np.dtype(getattr(ml_dtypes, name)) for name in ML_NAMES]
ML_DTYPES.append(ML_DTYPES[0].newbyteorder(">"))  # big-endian bfloat16


def _label(dtype: np.dtype[Any]) -> str:
    order = {"<": "le", ">": "be", "|": "", "=": "le" if sys.byteorder == "little" else "be"}
    return f"{dtype.name}{'-' + order[dtype.byteorder] if order[dtype.byteorder] else ''}"


def _view() -> Array:
    base = sample("<f8", (4, 6))
    return base[1:3]


LAYOUTS: dict[str, Callable[[], Array]] = {
    "0-d f8": lambda: np.array(-0.0),
    "0-d bool": lambda: np.array(True),
    "0-d bf16": lambda: sample(ml_dtypes.bfloat16, ()),
    "0-d U3": lambda: np.array("ab✓"),
    "0-d M8": lambda: np.array(np.datetime64("2024-02-29T12:00", "ns")),
    "empty (0,)": lambda: np.zeros((0,), dtype="<f4"),
    "empty (3,0,2)": lambda: np.zeros((3, 0, 2), dtype=">i8"),
    "empty f8e4m3fn": lambda: np.zeros((0, 4), dtype=ml_dtypes.float8_e4m3fn),
    "empty S5": lambda: np.zeros((2, 0), dtype="S5"),
    "strided": lambda: sample("<f8", (8, 6))[::2, 1::3],
    "negative stride": lambda: sample(">i2", (20,))[::-3],
    "transposed": lambda: sample("<i4", (4, 7)).T,
    "transposed 3-d": lambda: sample(">c8", (2, 3, 4)).transpose(2, 0, 1),
    "fortran": lambda: np.asfortranarray(sample("<f4", (5, 3, 2))),
    "fortran big-endian": lambda: np.asfortranarray(sample(">f8", (4, 3))),
    "fortran bf16": lambda: np.asfortranarray(sample(ml_dtypes.bfloat16, (4, 3))),
    "row view": _view,
    "dtype view": lambda: sample("<f8", (3, 4)).view("<u4"),
    "strided bf16": lambda: sample(ml_dtypes.bfloat16, (6, 8))[::2, ::-3],
    "strided U5 big-endian": lambda: sample(">U5", (6, 4))[1::2],
    "strided M8": lambda: sample("<M8[ns]", (5, 4))[:, ::2],
    "broadcast": lambda: np.broadcast_to(sample("<f4", (1, 5)), (4, 5)),
    "read-only": lambda: _read_only(sample("<i8", (3, 3))),
    "large, many chunks": lambda: sample("<f4", (97, 131)),
    "matrix subclass": lambda: _matrix(sample("<f8", (40, 30))),
    "strided, many chunks": lambda: sample(">i4", (120, 90))[::3, 1::2],
    # 1 MiB or more: written from their own memory (O_DIRECT on local disk), also for
    # dtypes without a buffer format
    "large M8": lambda: sample("<M8[ns]", (140_000,)),
    "large bf16": lambda: sample(ml_dtypes.bfloat16, (3, 200_000)),
    "large big-endian": lambda: sample(">f8", (400, 350)),
}
"""Layouts: 0-d, empty, non-contiguous, Fortran-order and views."""


def _matrix(array: Array) -> Array:
    """An ndarray subclass that stays 2-D through ``reshape(-1)``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PendingDeprecationWarning)
        return np.asmatrix(array)


def _read_only(array: Array) -> Array:
    array.flags.writeable = False
    return array


def all_values() -> dict[str, Array]:
    values = {f"dtype/{_label(d)}": sample(d) for d in NUMPY_DTYPES + ML_DTYPES}
    values.update({f"layout/{name.replace(' ', '_')}": make() for name, make in LAYOUTS.items()})
    return values


VALUES = all_values()


def assert_same(actual: Array, expected: Array, name: str) -> None:
    assert isinstance(actual, np.ndarray), name
    assert not isinstance(actual, np.ma.MaskedArray), name
    assert actual.dtype == expected.dtype, f"{name}: dtype {actual.dtype!r} != {expected.dtype!r}"
    assert actual.dtype.isnative == expected.dtype.isnative, f"{name}: the byte order differs"
    assert actual.dtype.str == expected.dtype.str, (
        f"{name}: {actual.dtype.str} != {expected.dtype.str}"
    )
    assert actual.shape == expected.shape, f"{name}: shape {actual.shape} != {expected.shape}"
    assert actual.tobytes() == expected.tobytes(), f"{name}: the bytes differ"


# -- local disk: every format --------------------------------------------------------------

FORMATS: dict[str, Callable[[], Any]] = {
    "zarr": lambda: "zarr",
    "zarr-zstd": lambda: ZarrDB(compression="zstd"),
    "npz": lambda: "npz",
    "lmdb": lambda: "lmdb",
}


def save_and_load_locally(root: Path, db_type: Any, values: dict[str, Array]) -> dict[str, Array]:
    session = LocalSession()
    workspace = session.workspace(NODE)
    for name, value in values.items():
        workspace[name] = value
    manager = CheckpointManager(str(root), NODE, db_type, io=SMALL_CHUNKS)
    session.run(manager.init([NODE]))
    session.run(manager.save(1))

    fresh = LocalSession()
    reader = CheckpointManager(str(root), NODE, db_type)
    fresh.run(reader.init([NODE], retrieve_from_epoch=1))
    fresh.run(reader.load(1))
    return dict(fresh.workspace(NODE))


@pytest.fixture(scope="module", params=sorted(FORMATS))
def loaded(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Every value saved in one checkpoint of the format, and loaded back."""
    root = tmp_path_factory.mktemp(f"values-{request.param}")
    return request.param, save_and_load_locally(root, FORMATS[request.param](), VALUES)


@pytest.mark.parametrize("name", sorted(VALUES))
def test_every_value_round_trips_bit_for_bit(loaded: Any, name: str) -> None:
    db_type, values = loaded
    assert_same(values[name], VALUES[name], f"{db_type}: {name}")


def test_the_table_covers_what_the_issue_lists() -> None:
    kinds = {(d.kind, d.itemsize, d.byteorder) for d in NUMPY_DTYPES}
    for code in ("i2", "u8", "f2", "f8", "c16", "M8[ns]", "m8[s]"):
        dtype = np.dtype(code)
        assert (dtype.kind, dtype.itemsize, ">") in kinds, code
        assert (dtype.kind, dtype.itemsize, "<") in kinds, code
    special = VALUES["dtype/float32-le"].reshape(-1).view("<u4")
    assert special[1] == 0x7F800001, "a signalling NaN payload is in the table"
    assert VALUES["dtype/float64-be"].reshape(-1).view(">u8")[3] == 0x8000000000000000  # -0.0
    assert VALUES["dtype/bfloat16-be"].dtype.byteorder == ">"
    assert not VALUES["layout/fortran"].flags.c_contiguous
    for name in ("layout/large,_many_chunks", "layout/matrix_subclass"):
        assert VALUES[name].nbytes > 2 * SMALL_CHUNKS.chunk_bytes, f"{name} spans chunks"


def test_signalling_nan_payloads_survive_a_round_trip_through_every_format(
    tmp_path: Path,
) -> None:
    values = {
        f"nan{width}": np.array(bits, dtype=f"<u{width}").view(f"<f{width}")
        for width, bits in _SPECIAL_BITS.items()
    }
    for fmt, make in FORMATS.items():
        loaded = save_and_load_locally(tmp_path / fmt, make(), values)
        for name, value in values.items():
            assert (
                loaded[name].view(f"<u{value.itemsize}").tolist()
                == value.view(f"<u{value.itemsize}").tolist()
            ), f"{fmt}: {name}"


# -- S3: zarr and npz, one checkpoint each -------------------------------------------------


@pytest.mark.parametrize("db_type", ["zarr", "npz"])
def test_every_value_round_trips_on_s3(
    s3_url: str, s3_storage_options: dict[str, Any], db_type: str
) -> None:
    session = LocalSession()
    workspace = session.workspace(NODE)
    for name, value in VALUES.items():
        workspace[name] = value
    options = {"storage_options": s3_storage_options, "io": SMALL_CHUNKS}
    manager = MultiNodeCheckpointManager(s3_url, db_type, **options)
    session.run(manager.init([NODE]))
    session.run(manager.save(1))

    fresh = LocalSession()
    reader = MultiNodeCheckpointManager(s3_url, db_type, **options)
    fresh.run(reader.init([NODE], retrieve_from_epoch=1))
    fresh.run(reader.load(1))
    loaded = fresh.workspace(NODE)
    assert sorted(loaded) == sorted(VALUES)
    for name, value in VALUES.items():
        assert_same(loaded[name], value, f"s3 {db_type}: {name}")


# -- refusals ------------------------------------------------------------------------------

REFUSED: dict[str, tuple[Callable[[], Any], str]] = {
    "object": (lambda: np.array([1, "a", None], dtype=object), "pickle"),
    "structured": (lambda: np.zeros(3, dtype=[("a", "<i4"), ("b", "<f8")]), "field"),
    "void": (lambda: np.zeros(3, dtype="V4"), "not plain data"),
    "masked": (lambda: np.ma.masked_array([1.0, 2.0], mask=[False, True]), "mask"),
    "big-endian datetime without unit": (lambda: np.zeros(2, dtype="<M8").view(">M8"), "unit"),
}


def write_directly(manager: CheckpointManager, blobs: dict[str, Any]) -> None:
    """The save path below the workspace (what every manager's save calls)."""
    location = manager.location
    protocol.write_node(location.storage, NODE, 1, blobs, location.db_type, location.engine())


@pytest.mark.parametrize("kind", sorted(REFUSED))
@pytest.mark.parametrize("db_type", sorted(FORMATS))
def test_values_that_cannot_round_trip_are_refused_naming_the_blob(
    tmp_path: Path, kind: str, db_type: str
) -> None:
    make, reason = REFUSED[kind]
    workspace = LocalSession().workspace(NODE)
    workspace["ok"] = np.ones(2)
    with pytest.raises(UnsupportedBlobError, match=reason) as caught:
        workspace["bad"] = make()
    assert caught.value.blob == "bad"
    assert "'bad'" in str(caught.value)
    assert isinstance(caught.value, TypeError)
    assert sorted(workspace) == ["ok"]
    # the save path refuses too, before writing anything
    manager = CheckpointManager(str(tmp_path), NODE, FORMATS[db_type]())
    with pytest.raises(UnsupportedBlobError, match=reason) as caught:
        write_directly(manager, {"ok": np.ones(2), "bad": make()})
    assert caught.value.blob == "bad"
    assert list(tmp_path.iterdir()) == []


def test_a_masked_array_is_refused_at_save_even_if_it_bypassed_the_workspace(
    tmp_path: Path,
) -> None:
    manager = CheckpointManager(str(tmp_path), NODE, "npz")
    masked = np.ma.masked_array([1.0, 2.0], mask=[False, True])
    with pytest.raises(UnsupportedBlobError, match="mask") as caught:
        write_directly(manager, {"m": masked})
    assert caught.value.blob == "m"
    assert list(tmp_path.iterdir()) == []


def test_loading_ml_dtypes_without_the_package_names_the_blob_and_the_install_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    values = {"w": sample(ml_dtypes.bfloat16), "plain": sample("<f4")}
    save_and_load_locally(tmp_path, "npz", values)
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # import ml_dtypes -> ImportError
    fresh = LocalSession()
    reader = CheckpointManager(str(tmp_path), NODE, "npz")
    fresh.run(reader.init([NODE], retrieve_from_epoch=1))
    with pytest.raises(UnsupportedBlobError, match=r"pip install ml_dtypes") as caught:
        fresh.run(reader.load(1))
    assert caught.value.blob == "w"
    assert ML_DTYPES_INSTALL in str(caught.value)


# -- refusals are not retried --------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value", "error", "message"),
    [
        ("m", np.ma.masked_array([1.0], mask=[True]), UnsupportedBlobError, "mask"),
        ("x" * 256, np.ones(1), InvalidNameError, "255"),
        ("layer/" + "é" * 200, np.ones(1), InvalidNameError, "255"),
    ],
)
@pytest.mark.parametrize("multinode", [False, True])
def test_a_refused_value_stops_the_job_at_once_and_is_never_retried(
    tmp_path: Path, name: str, value: Any, error: type[Exception], message: str, multinode: bool
) -> None:
    with Job() as job, Node(NODE):
        with job.init_group:
            Task(lambda ws: ws.update({"fine": np.zeros(2), name: value}), name="init")
        epoch_limiter(job, 2)
    manager: Any = (
        MultiNodeCheckpointManager(str(tmp_path), "zarr")
        if multinode
        else CheckpointManager(str(tmp_path), NODE, "zarr")
    )
    runner = JobRunner(job, manager, save_retries=5)
    with pytest.raises(error, match=message):
        runner.train(LocalSession())
    assert runner.save_failures == []
    assert runner.committed_epochs == []
    leases = tmp_path / "_ckptstore" / "lease"  # a released lease document stays
    stored = [p for p in tmp_path.rglob("*") if p.is_file() and leases not in p.parents]
    assert stored == []  # no checkpoint, record or staging file


@pytest.mark.parametrize("db_type", sorted(FORMATS))
def test_a_blob_name_segment_over_255_bytes_is_refused_at_save_on_every_format(
    tmp_path: Path, db_type: str
) -> None:
    manager = CheckpointManager(str(tmp_path), NODE, FORMATS[db_type]())
    name = "model/" + "w" * 256
    with pytest.raises(InvalidNameError, match="255") as caught:
        write_directly(manager, {name: np.ones(1)})
    assert caught.value.name == name
    assert isinstance(caught.value, ValueError)
    assert list(tmp_path.iterdir()) == []


def test_a_checkpoint_stored_with_a_long_name_segment_before_the_limit_still_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = "old/" + "n" * 300
    with monkeypatch.context() as patch:  # as saved by an earlier version
        patch.setattr("ckptstore.records._names.MAX_SEGMENT_BYTES", 1024)
        loaded = save_and_load_locally(tmp_path / "saved", "npz", {name: np.arange(3)})
    assert_same(loaded[name], np.arange(3), name)
    fresh = LocalSession()
    reader = CheckpointManager(str(tmp_path / "saved"), NODE, "npz")
    fresh.run(reader.init([NODE], retrieve_from_epoch=1))
    fresh.run(reader.load(1))
    assert_same(fresh.workspace(NODE)[name], np.arange(3), name)
