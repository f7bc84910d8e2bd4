"""Every reader reads every checkpoint: each value ckptstore stores, written by ckptstore
(``zarr`` and ``npz`` nodes, local disk and a moto S3 server), read back without it by
zarr-python 3, xarray (``open_zarr`` and ``open_datatree``), TensorStore (its ``zarr3``
driver over a ``zip`` kvstore), dask.array, numpy (``.npz``) and fsspec's ``zip::s3://``.

A reader gives what docs/values.md says plain readers give: the same values in native
byte order (``.npz`` keeps the stored order), ml_dtypes as the unsigned integers they
are stored as, longdouble as its raw bytes. A cell a reader cannot read is not skipped:
docs/values.md lists it with its reason ("Reading without ckptstore"), and the tests
check that list against what the readers do, both ways (a listed cell that reads is a
stale entry)."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from ckpt_helpers import data_key, node_dir

from ckptstore.formats import _zarr_db
from ckptstore.plugin._registry import get_registry
from ckptstore.protocol import _commit as protocol
from ckptstore.protocol._location import CheckpointLocation
from ckptstore.records._dtypes import ML_DTYPE_NAMES, plain_dtype
from ckptstore.testing.conformance.samples import OPTIONAL_DTYPES, REQUIRED_DTYPES, dtype_sample

Array = np.ndarray[Any, Any]
VALUES_DOC = Path(__file__).resolve().parents[2] / "docs" / "values.md"
ZARR_ARCHIVE, NPZ_ARCHIVE = "blobs.zarr.zip", "blobs.npz"
_ZARR_FLOATS = {"f": (2, 4, 8), "c": (8, 16)}  # the float sizes zarr has types for


def _ml_sample(name: str) -> Array:
    dtype = np.dtype(getattr(ml_dtypes, name))
    if dtype.kind in "iu":  # int4 and the like: values they can hold
        return np.arange(15).reshape(3, 5).astype(dtype)
    return (np.arange(15).reshape(3, 5) % 4 * 0.5).astype(dtype)


def _samples() -> dict[str, Array]:
    """Each value ckptstore stores, by the name its kind has in docs/values.md's list:
    numpy's dtype strings, ml_dtypes names, and the shapes ``0-d`` and ``empty``."""
    samples = {np.dtype(d).str: dtype_sample(d) for d in REQUIRED_DTYPES + OPTIONAL_DTYPES}
    samples.update({name: _ml_sample(name) for name in sorted(ML_DTYPE_NAMES)})
    samples["0-d"] = np.array(7.25)
    samples["empty"] = np.zeros((2, 0, 3), np.float32)
    samples["chunks"] = np.arange(1009 * 300, dtype=">f4").reshape(1009, 300)  # see write_node
    return samples


SAMPLES = _samples()
BLOBS = {f"v{number}": array for number, array in enumerate(SAMPLES.values())}
NAMES = dict(zip(SAMPLES, BLOBS, strict=True))  # sample -> blob name
TREE = "model"  # every blob is also under this group, which open_datatree reads as a node


def category(sample: str) -> str:
    """The kind docs/values.md names for a sample: ``S<n>``, ``U<n>``, ``datetime64``,
    ``timedelta64``, ``longdouble``, ``clongdouble``, ``ml_dtypes``, or the sample's
    own name (``<f4``, ``0-d``...)."""
    if sample in ML_DTYPE_NAMES:
        return "ml_dtypes"
    if sample in ("0-d", "empty", "chunks"):
        return sample
    dtype = np.dtype(sample)
    if dtype.kind in "fc" and dtype.itemsize not in _ZARR_FLOATS[dtype.kind]:
        return "longdouble" if dtype.kind == "f" else "clongdouble"
    names = {"S": "S<n>", "U": "U<n>", "M": "datetime64", "m": "timedelta64"}
    return names.get(dtype.kind, sample)


def as_plain_readers_give(array: Array, *, npy: bool = False) -> Array:
    """``array`` as a reader without ckptstore gives it back (docs/values.md): from zarr
    in native byte order, longdouble as raw bytes; from ``.npy`` in the stored order,
    longdouble as itself; ml_dtypes as unsigned integers from both."""
    plain = plain_dtype(array.dtype)
    if npy:
        return array.view(plain)
    if category(plain.str) in ("longdouble", "clongdouble"):
        return array.view(f"V{plain.itemsize}")
    return array.view(plain).astype(plain.newbyteorder("="))


def same(got: Any, expected: Array) -> bool:
    got = np.asarray(got)
    return (
        got.dtype == expected.dtype
        and got.shape == expected.shape
        and np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(expected).tobytes()
    )


def write_node(url: str, node: str, db_type: str) -> None:
    """Every sample, at the root and under ``TREE``. Arrays over 1 MiB are stored as
    chunks of at most 64 KiB (64 and 16 MiB by default), so that the ``chunks`` sample
    (1.2 MiB) is a chunk grid with a padded edge chunk, as large arrays are."""
    location = CheckpointLocation.open(url, db_type)
    blobs = {**BLOBS, **{f"{TREE}/{name}": array for name, array in BLOBS.items()}}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_zarr_db, "CHUNKED_FROM", 1 << 20)
        patch.setattr(_zarr_db, "CHUNK_BYTES", 64 << 10)
        commit = protocol.write_node(
            location.storage, node, 1, blobs, location.db_type, location.engine()
        )
    protocol.commit_epoch(location.storage, 1, [commit])


# -- what docs/values.md lists ------------------------------------------------------------


def listed_unreadable() -> dict[str, set[str]]:
    """docs/values.md's list: reader -> the kinds it cannot read. Each row of the table
    under "## Reading without ckptstore" names a reader (first cell, in backticks) and
    the kinds (in backticks) it cannot read (second cell), then why."""
    text = VALUES_DOC.read_text()
    match = re.search(r"^## Reading without ckptstore\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, "docs/values.md has no '## Reading without ckptstore' section"
    listed: dict[str, set[str]] = {}
    for line in match.group(1).splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0].startswith("`"):
            reader = cells[0].strip("`")
            listed.setdefault(reader, set()).update(re.findall(r"`([^`]+)`", cells[1]))
    return listed


def assert_matches_the_list(reader: str, failures: dict[str, str]) -> None:
    """The kinds ``reader`` failed (sample -> what went wrong) are those docs/values.md
    lists for it: every kind of a failed sample listed, every listed kind failing."""
    failed = {category(sample) for sample in failures}
    listed = listed_unreadable().get(reader, set())
    unlisted = {s: why for s, why in failures.items() if category(s) not in listed}
    assert not unlisted, f"{reader} cannot read these, and docs/values.md does not say: {unlisted}"
    stale = listed - failed
    assert not stale, f"docs/values.md says {reader} cannot read {stale}, but it reads them"


def failures_of(read: Callable[[str], Any], *, npy: bool = False) -> dict[str, str]:
    """Each sample ``read`` (given a blob name) gets wrong or cannot read: what went wrong."""
    failures = {}
    for sample, array in SAMPLES.items():
        expected = as_plain_readers_give(array, npy=npy)
        try:
            got = read(NAMES[sample])
        except Exception as error:  # a reader's refusal is a cell's outcome, recorded
            failures[sample] = f"{type(error).__name__}: {str(error)[:200]}"
            continue
        if not same(got, expected):
            failures[sample] = f"read {np.asarray(got).dtype} {np.shape(got)}, not {expected.dtype}"
    return failures


# -- local readers -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def local_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("readers")
    write_node(str(root), "zarr_node", "zarr")
    write_node(str(root), "npz_node", "npz")
    return root


def zarr_python(archive: Path) -> Callable[[str], Any]:
    import zarr

    group = zarr.open_group(zarr.storage.ZipStore(archive, mode="r"), mode="r")
    return lambda name: group[name][...]


def xarray_open_zarr(archive: Path) -> Callable[[str], Any]:
    import xarray as xr
    import zarr

    dataset = xr.open_zarr(zarr.storage.ZipStore(archive, mode="r"), consolidated=False)
    return lambda name: dataset[name].values


def xarray_open_datatree(archive: Path) -> Callable[[str], Any]:
    import xarray as xr
    import zarr

    store = zarr.storage.ZipStore(archive, mode="r")
    node = xr.open_datatree(store, engine="zarr", consolidated=False)[TREE]
    return lambda name: node[name].values


def tensorstore_zarr3(archive: Path) -> Callable[[str], Any]:
    import tensorstore as ts

    def read(name: str) -> Any:
        spec = {
            "driver": "zarr3",
            "kvstore": {"driver": "zip", "base": {"driver": "file", "path": str(archive)}},
            "path": name,
        }
        return ts.open(spec, read=True).result().read().result()

    return read


def dask_from_zarr(archive: Path) -> Callable[[str], Any]:
    import dask.array as da
    import zarr

    group = zarr.open_group(zarr.storage.ZipStore(archive, mode="r"), mode="r")
    return lambda name: da.from_zarr(group[name]).compute(scheduler="synchronous")


LOCAL_READERS: dict[str, Callable[[Path], Callable[[str], Any]]] = {
    "zarr-python": zarr_python,
    "xarray.open_zarr": xarray_open_zarr,
    "xarray.open_datatree": xarray_open_datatree,
    "tensorstore": tensorstore_zarr3,
    "dask.array": dask_from_zarr,
}


@pytest.mark.parametrize("reader", LOCAL_READERS)
def test_a_zarr_reader_reads_every_value_or_the_docs_say_why(local_root: Path, reader: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zarr-python's warnings on its own extension types
        read = LOCAL_READERS[reader](node_dir(local_root, "zarr_node", 1) / ZARR_ARCHIVE)
        failures = failures_of(read)
    assert_matches_the_list(reader, failures)


def test_numpy_reads_every_value_of_an_npz_node(local_root: Path) -> None:
    with np.load(node_dir(local_root, "npz_node", 1) / NPZ_ARCHIVE, allow_pickle=False) as opened:
        failures = failures_of(lambda name: opened[name], npy=True)
    assert_matches_the_list("numpy", failures)


def test_the_chunks_sample_is_a_chunk_grid(local_root: Path) -> None:
    import zarr

    store = zarr.storage.ZipStore(node_dir(local_root, "zarr_node", 1) / ZARR_ARCHIVE, mode="r")
    array = zarr.open_group(store, mode="r")[NAMES["chunks"]]
    assert isinstance(array, zarr.Array)
    assert array.chunks[0] < SAMPLES["chunks"].shape[0]
    assert SAMPLES["chunks"].shape[0] % array.chunks[0]  # an edge chunk, padded


def test_ml_dtypes_blobs_name_their_type_for_plain_readers(local_root: Path) -> None:
    """The unsigned integers a plain zarr reader gets for an ml_dtypes blob view back
    as the type its ``ckptstore_dtype`` attribute names."""
    import zarr

    store = zarr.storage.ZipStore(node_dir(local_root, "zarr_node", 1) / ZARR_ARCHIVE, mode="r")
    group = zarr.open_group(store, mode="r")
    for name in sorted(ML_DTYPE_NAMES):
        array = group[NAMES[name]]
        named = str(array.attrs["ckptstore_dtype"])
        restored = array[...].view(getattr(ml_dtypes, named.split(".", 1)[1]))
        assert same(restored, SAMPLES[name]), name


# -- S3 through fsspec ---------------------------------------------------------------------


def fsspec_zip_s3(url: str) -> Callable[[str], Any]:
    import zarr

    group = zarr.open_group(f"zip::{url}", mode="r")
    return lambda name: group[name][...]


def test_fsspec_reads_every_value_from_s3(s3_url: str) -> None:
    def s3_key(node: str) -> str:
        return data_key(get_registry().open_path(s3_url), node, 1)

    """``zip::s3://`` (zarr-python over fsspec's ZIP reader and s3fs) for a zarr node,
    ``fsspec.open`` and numpy for an npz node, on the moto server."""
    import fsspec

    write_node(s3_url, "zarr_node", "zarr")
    write_node(s3_url, "npz_node", "npz")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        failures = failures_of(fsspec_zip_s3(f"{s3_url}/{s3_key('zarr_node')}/{ZARR_ARCHIVE}"))
    assert_matches_the_list("fsspec zip::s3", failures)
    with (
        fsspec.open(f"{s3_url}/{s3_key('npz_node')}/{NPZ_ARCHIVE}") as file,
        np.load(file, allow_pickle=False) as opened,
    ):
        failures = failures_of(lambda name: opened[name], npy=True)
    assert_matches_the_list("fsspec s3 + numpy", failures)


def _names() -> Iterator[str]:
    yield from LOCAL_READERS
    yield from ("numpy", "fsspec zip::s3", "fsspec s3 + numpy")


def test_the_list_names_only_readers_and_kinds_the_matrix_has() -> None:
    """docs/values.md's list cannot drift from the matrix: every reader it names is one
    of the matrix's, every kind one of the samples' kinds."""
    kinds = {category(sample) for sample in SAMPLES}
    for reader, listed in listed_unreadable().items():
        assert reader in set(_names()), f"docs/values.md lists an unknown reader {reader!r}"
        assert listed <= kinds, f"docs/values.md lists unknown kinds {listed - kinds}"
