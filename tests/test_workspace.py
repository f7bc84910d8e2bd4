"""Workspaces: a node's blobs, and the private view PRIVATE tasks work in."""

from __future__ import annotations

import numpy as np
import pytest

from ckptstore import Workspace
from ckptstore.errors import BlobNotFoundError, InvalidNameError, UnsupportedBlobError
from ckptstore.execution._workspace import PrivateWorkspace, as_blob


def test_workspace_is_a_mapping_holding_arrays_by_reference() -> None:
    ws = Workspace({"total": [100]})
    array = ws["total"]
    assert isinstance(array, np.ndarray)
    ws["total"] += 3
    assert ws["total"] is array
    assert array.tolist() == [103]
    assert len(ws) == 1
    assert "total" in ws
    assert "other" not in ws
    del ws["total"]
    assert list(ws) == []


def test_values_are_converted_with_asarray() -> None:
    ws = Workspace()
    ws["scalar"] = 3.5
    ws["flags"] = [True, False]
    ws["text"] = np.array(["ab", "c"])
    assert ws["scalar"].shape == ()
    assert ws["scalar"].dtype == np.float64
    assert ws["flags"].dtype == np.bool_
    assert ws["text"].dtype.kind == "U"
    original = np.arange(3)
    ws["same"] = original
    assert ws["same"] is original


def test_missing_blob_raises_a_key_error_that_says_what_to_do() -> None:
    with pytest.raises(BlobNotFoundError) as info:
        Workspace()["w"]
    assert isinstance(info.value, KeyError)
    assert info.value.blobs == ("w",)
    assert "init_group" in str(info.value)


@pytest.mark.parametrize(
    "value",
    [
        np.array([1, "a", None], dtype=object),
        [1, None],
        np.zeros(2, dtype=[("a", "i4"), ("b", "f8")]),
        np.zeros(2, dtype=[("o", "O")]),
        np.zeros(2, dtype="V8"),
    ],
    ids=["object", "implicit-object", "structured", "structured-object", "void"],
)
def test_blobs_that_would_need_pickle_or_fields_are_refused(value: object) -> None:
    ws = Workspace()
    with pytest.raises(UnsupportedBlobError) as info:
        ws["bad"] = value
    assert info.value.blob == "bad"
    assert isinstance(info.value, TypeError)
    assert "bad" not in ws
    with pytest.raises(UnsupportedBlobError):
        as_blob("bad", value)


def test_invalid_names_are_refused() -> None:
    with pytest.raises(InvalidNameError):
        Workspace()["a/../b"] = 1


def test_private_view_writes_existing_names_through_and_keeps_new_ones_private() -> None:
    parent = Workspace({"total": [100]})
    view = PrivateWorkspace(parent, keep=())
    view["total"] = view["total"] + 1
    view["tmp"] = np.ones(2)
    assert parent["total"].tolist() == [101]
    assert "tmp" not in parent
    assert view["tmp"].tolist() == [1.0, 1.0]
    assert sorted(view) == ["tmp", "total"]
    assert len(view) == 2
    assert "tmp" in view
    assert "total" in view


def test_private_view_in_place_updates_reach_the_parent() -> None:
    parent = Workspace({"w": np.zeros(3)})
    view = PrivateWorkspace(parent, keep=())
    view["w"] += 2.0
    assert parent["w"].tolist() == [2.0, 2.0, 2.0]


def test_declared_outputs_persist_even_when_created_in_the_view() -> None:
    parent = Workspace()
    view = PrivateWorkspace(parent, keep=("done",))
    view["done"] = True
    view["other"] = False
    assert sorted(parent) == ["done"]
    assert parent["done"].item() is True


def test_private_view_deletes_its_own_blobs_first() -> None:
    parent = Workspace({"a": 1})
    view = PrivateWorkspace(parent, keep=())
    view["b"] = 2
    del view["b"]
    assert "b" not in view
    del view["a"]
    assert "a" not in parent
    with pytest.raises(BlobNotFoundError):
        view["a"]


def test_private_view_validates_private_blobs_too() -> None:
    view = PrivateWorkspace(Workspace(), keep=())
    with pytest.raises(UnsupportedBlobError):
        view["tmp"] = np.array([None])
    with pytest.raises(InvalidNameError):
        view["../tmp"] = 1
