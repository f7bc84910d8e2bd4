"""The LMDB page walk: it finds every value, and refuses what it does not understand."""

from __future__ import annotations

import os
from pathlib import Path

import lmdb
import pytest
from ckptstore_lmdb import LmdbFormatError, value_spans

from ckptstore.errors import CkptStoreError


def write_database(path: Path, values: dict[bytes, bytes], **options: object) -> bytes:
    env = lmdb.open(str(path), map_size=1 << 28, lock=False, **options)
    with env.begin(write=True) as txn:
        for key, value in values.items():
            txn.put(key, value)
    env.close()
    return (path / "data.mdb").read_bytes()


def test_finds_inline_and_overflow_values_in_a_deep_tree(tmp_path: Path) -> None:
    sizes = [0, 1, 100, 1500, 2100, 4096, 70_000]
    values = {b"k%05d" % i: os.urandom(sizes[i % len(sizes)]) for i in range(3000)}
    data = write_database(tmp_path, values)
    spans = value_spans(data)
    assert set(spans) == set(values)
    for key, value in values.items():
        span = spans[key]
        assert data[span.offset : span.offset + span.size] == value


def test_an_empty_database_has_no_values(tmp_path: Path) -> None:
    assert value_spans(write_database(tmp_path, {})) == {}


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda data: data[:100], "too short"),
        (lambda data: b"\0" * 16 + b"\xde\xad" + data[18:], "no LMDB meta page"),
        (lambda data: data[: len(data) // 2], "past the end|beyond the end"),
    ],
)
def test_damaged_files_are_refused(tmp_path: Path, damage: object, message: str) -> None:
    data = write_database(tmp_path, {b"k%03d" % i: b"v" * 3000 for i in range(40)})
    with pytest.raises(LmdbFormatError, match=message) as caught:
        value_spans(damage(data))  # type: ignore[operator]
    assert isinstance(caught.value, CkptStoreError)


def test_duplicate_key_databases_are_refused(tmp_path: Path) -> None:
    env = lmdb.open(str(tmp_path), map_size=1 << 24, lock=False, max_dbs=2)
    named = env.open_db(b"named")
    with env.begin(write=True) as txn:
        txn.put(b"k", b"v", db=named)
    env.close()
    with pytest.raises(LmdbFormatError, match="named or duplicate-key"):
        value_spans((tmp_path / "data.mdb").read_bytes())
