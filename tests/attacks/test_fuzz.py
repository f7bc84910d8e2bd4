"""A structured fuzzer over every stored document and data file of every format.

Each example copies a pristine run, mutates one stored file of epoch 1 (byte flips,
truncation, extension, a link to a file outside the prefix, or a JSON-structure
mutation of a document: huge or negative numbers, deep nesting, wrong types, unicode,
path-like strings), optionally re-signs every checksum so they match the forgery,
then loads the epoch. Property: the load returns exactly the saved values, or (only
for re-signed forgeries) values of the recorded dtypes and shapes, or raises a
CkptStoreError; nothing outside the prefix is accessed; memory stays bounded.

Profiles: ``ci`` (default, bounded) and ``long``:
``CKPTSTORE_FUZZ_PROFILE=long pytest tests/attacks/test_fuzz.py`` (see docs/security.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tracemalloc
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptstore.checkpoint._multinode import MultiNodeCheckpointManager
from ckptstore.checkpoint._runner import JobRunner
from ckptstore.errors import CkptStoreError
from ckptstore.execution._session import LocalSession
from ckptstore.testing.conformance.jobs import NODES, counting_job
from tests.attacks.attacks import ALL_FORMATS
from tests.attacks.forge import Forge, OutsideWatch, canonical, chunk_checksum, signed
from tests.attacks.test_attacks import db_type

Values = dict[str, dict[str, np.ndarray[Any, Any]]]
"""Loaded or saved blobs: node -> blob name -> value."""

EPOCH = 1
MEMORY_BOUND = 128 << 20

settings.register_profile(
    "ci",
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,
)
settings.register_profile(
    "long",
    max_examples=20_000,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
PROFILE_NAME = os.environ.get("CKPTSTORE_FUZZ_PROFILE", "ci")
PROFILE = settings.get_profile(PROFILE_NAME)
CAMPAIGN_MARKS = [] if PROFILE_NAME == "ci" else [pytest.mark.timeout(0)]
"""The suite's limit of 300 s per test holds for the ``ci`` profile; a long campaign
runs each test for as long as its examples take (zarr-zstd's 20,000 took longer)."""
pytestmark = CAMPAIGN_MARKS


@dataclass(frozen=True)
class Pristine:
    fmt: str
    run: Path
    values: Values
    targets: tuple[str, ...]  # files of epoch 1 that may be mutated, relative to run


def _load(run: Path, fmt: str) -> Values:
    session = LocalSession()
    manager = MultiNodeCheckpointManager(str(run), db_type(fmt))
    session.run(manager.init(list(NODES), retrieve_from_epoch=EPOCH))
    session.run(manager.load(EPOCH))
    values = {}
    for node in NODES:
        manifest = json.loads(Forge(run, node, EPOCH).manifest_path.read_bytes())
        values[node] = {name: session.fetch_blob(node, name) for name in manifest["blobs"]}
    return values


@pytest.fixture(scope="module", params=[*ALL_FORMATS, "zarr-zstd"])
def pristine(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Pristine:
    fmt = request.param
    run = tmp_path_factory.mktemp(f"pristine-{fmt}") / "run"
    manager = MultiNodeCheckpointManager(str(run), db_type(fmt), metadata_handler="json")
    assert JobRunner(counting_job(epochs=EPOCH), manager).train(LocalSession()) == EPOCH
    forge = Forge(run, NODES[0], EPOCH)
    targets = sorted(
        str(path.relative_to(run))
        for path in [
            *forge.db.rglob("*"),
            forge.commit_path,
            *forge.commit_path.parent.glob("*.json"),
        ]
        if path.is_file()
    )
    return Pristine(fmt, run, _load(run, fmt), tuple(dict.fromkeys(targets)))


# -- mutations ---------------------------------------------------------------------------

NASTY_NUMBERS = [2**64, 2**63, 2**63 - 1, 10**30, -1, -(2**63), 0, 1e308, -0.0, 3.5]
NASTY_STRINGS = [
    "../x",
    "../../outside/secret",
    "/etc/passwd",
    "",
    ".",
    "a/../../b",
    "\u202e\u0000",
    "C:\\x",
    "CON",
    "é" * 300,
    "|O",
    "<f8",
    "zstd",
    "x" * 5000,
]
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.sampled_from(NASTY_NUMBERS)
    | st.integers()
    | st.sampled_from(NASTY_STRINGS)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


@st.composite
def byte_mutation(draw: st.DrawFn) -> tuple[str, Any]:
    kind = draw(st.sampled_from(["flip", "truncate", "extend", "link_outside"]))
    if kind == "flip":
        return kind, (draw(st.integers(0, 1 << 20)), draw(st.integers(1, 255)))
    if kind == "truncate":
        return kind, draw(st.integers(0, 1 << 20))
    if kind == "extend":
        return kind, draw(st.binary(min_size=1, max_size=64))
    return kind, None


@st.composite
def json_mutation(draw: st.DrawFn) -> tuple[str, Any]:
    kind = draw(st.sampled_from(["replace", "delete", "deep", "rename_key"]))
    path_choices = draw(st.lists(st.integers(0, 1 << 16), min_size=1, max_size=6))
    if kind == "replace":
        return kind, (path_choices, draw(json_values))
    if kind == "deep":
        return kind, (path_choices, draw(st.integers(50, 200_000)))
    if kind == "rename_key":
        return kind, (path_choices, draw(st.sampled_from(NASTY_STRINGS)))
    return kind, (path_choices, None)


def _walk_to(document: Any, choices: list[int]) -> tuple[Any, Any]:
    """A container inside ``document`` and a key/index in it, chosen by ``choices``."""
    container: Any = None
    key: Any = None
    node = document
    for choice in choices:
        if isinstance(node, dict) and node:
            keys = sorted(node)
            container, key = node, keys[choice % len(keys)]
        elif isinstance(node, list) and node:
            container, key = node, choice % len(node)
        else:
            break
        node = container[key]
    return container, key


def _mutate_json(document: dict[str, Any], mutation: tuple[str, Any]) -> bytes:
    kind, (choices, value) = mutation
    container, key = _walk_to(document, choices)
    if container is None:
        container, key = document, "extra"
    if kind == "replace":
        container[key] = value
    elif kind == "delete":
        del container[key]
    elif kind == "rename_key" and isinstance(container, dict):
        container[value] = container.pop(key)
    if kind == "deep":
        container[key] = "@@deep@@"
        text = canonical(document)
        return text.replace(b'"@@deep@@"', b"[" * value + b"]" * value)
    try:
        return canonical(document)
    except (ValueError, TypeError):  # e.g. an integer too long to print: write it raw
        return canonical({"unprintable": 1})


def _mutate_bytes(path: Path, mutation: tuple[str, Any], outside: Path) -> None:
    kind, argument = mutation
    data = bytearray(path.read_bytes())
    if kind == "flip" and data:
        position, mask = argument
        data[position % len(data)] ^= mask
    elif kind == "truncate":
        del data[argument % (len(data) + 1) :]
    elif kind == "extend":
        data += argument
    elif kind == "link_outside":
        path.unlink()
        os.symlink(outside / "secret", path)
        return
    path.write_bytes(bytes(data))


def _resign(run: Path, relative: str) -> None:
    """Make every checksum agree with the forged file ``relative`` (as an attacker who
    can write checksums would): chunk CRCs in the manifest, the manifest's CRC in the
    commit record, and the documents' own CRCs."""
    forge = Forge(run, NODES[0], EPOCH)
    path = run / relative
    if path.is_symlink():
        return
    try:
        manifest = forge.manifest()
        for record in [*manifest["blobs"].values(), {"chunks": manifest["files"]}]:
            for chunk in record["chunks"]:
                if forge.db / chunk[0] == path:
                    data = path.read_bytes()[chunk[1] : chunk[1] + chunk[2]]
                    chunk[4] = chunk_checksum(manifest, data)
        forge.write_manifest(manifest)
    except (ValueError, KeyError, TypeError, AttributeError, IndexError):
        pass  # a forged manifest: it was re-signed when it was written


def forge_drawn(
    data: st.DataObject,
    run: Path,
    targets: Sequence[str],
    outside: Path,
    *,
    links: bool = True,
) -> bool:
    """Draw a file of ``run`` and a mutation of it (structural for JSON documents, else
    bytes; ``links``: a byte mutation may replace the file by a link to ``outside``),
    apply it, and maybe re-sign every checksum as an attacker who can write checksums
    would. Returns whether the checksums were re-signed."""
    target = data.draw(st.sampled_from(targets), label="file")
    path = run / target
    forged_signature = data.draw(st.booleans(), label="re-sign checksums")
    if path.suffix == ".json" and data.draw(st.booleans(), label="structural"):
        mutation = data.draw(json_mutation(), label="json mutation")
        body = json.loads(path.read_bytes())
        body.pop("crc32c", None)
        text = _mutate_json(body, mutation)
        raw = signed(text) if forged_signature else text
        forge = Forge(run, NODES[0], EPOCH)
        if path == forge.manifest_path:
            forge.write_manifest_bytes(raw)  # the commit record vouches for it
        else:
            path.write_bytes(raw)
    else:
        mutations = byte_mutation()
        if not links:
            mutations = mutations.filter(lambda mutation: mutation[0] != "link_outside")
        _mutate_bytes(path, data.draw(mutations, label="byte mutation"), outside)
        if forged_signature:
            _resign(run, target)
    return forged_signature


@dataclass
class Case:
    run: Path
    outside: Path
    watch: OutsideWatch
    originals: dict[Path, bytes]

    def restore(self) -> None:
        """Put back every file an example may have changed (cheaper than a copy)."""
        for path, data in self.originals.items():
            if path.is_symlink() or not path.exists() or path.read_bytes() != data:
                path.unlink(missing_ok=True)
                path.write_bytes(data)


@pytest.fixture
def case(pristine: Pristine, tmp_path: Path) -> Case:
    run, outside = tmp_path / "run", tmp_path / "outside"
    shutil.copytree(pristine.run, run, symlinks=True)
    outside.mkdir()
    (outside / "secret").write_bytes(b"outside the prefix")
    os.symlink(outside / "secret", run / "link-to-outside")  # a link inside the prefix
    originals = {run / target: (run / target).read_bytes() for target in pristine.targets}
    return Case(run, outside, OutsideWatch(outside), originals)


@PROFILE
@given(data=st.data())
def test_any_forgery_loads_exactly_or_fails_typed(
    pristine: Pristine, case: Case, data: st.DataObject
) -> None:
    case.watch.events()  # forget the previous example's own check of the secret
    try:
        forged_signature = forge_drawn(data, case.run, pristine.targets, case.outside)
        _check_load(pristine, case, exact=not forged_signature)
    finally:
        case.restore()


def _check_load(pristine: Pristine, case: Case, *, exact: bool) -> None:
    tracemalloc.start()
    try:
        try:
            loaded = _load(case.run, pristine.fmt)
        except CkptStoreError:
            loaded = None
        manager = MultiNodeCheckpointManager(
            str(case.run), db_type(pristine.fmt), metadata_handler="json"
        )
        manager.set_params(nodes=list(NODES))
        with contextlib.suppress(CkptStoreError):
            manager.get_resume_from_epoch_id(None)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < MEMORY_BOUND
    assert case.watch.events() == 0, "something outside the prefix was accessed"
    assert (case.outside / "secret").read_bytes() == b"outside the prefix"
    assert_loaded_matches(loaded, pristine.values, exact=exact)


def assert_loaded_matches(loaded: Values | None, saved: Values, *, exact: bool) -> None:
    """What a forged epoch loaded, against the ``saved`` values: nothing to check when
    the load failed typed (``None``); otherwise every node was loaded and, with
    ``exact`` (no checksum was re-signed), every blob has the saved dtype, shape and
    bytes."""
    if loaded is None:
        return
    for node, blobs in saved.items():
        got_blobs = loaded[node]
        if not exact:
            continue
        for name, value in blobs.items():
            got = got_blobs[name]
            assert got.dtype == value.dtype
            assert got.shape == value.shape
            assert got.tobytes() == value.tobytes()


def test_every_stored_file_replaced_by_a_link_out_fails_typed(
    pristine: Pristine, case: Case
) -> None:
    """Deterministic companion of the fuzzer: each stored file of the epoch, in turn,
    becomes a symbolic link to a file outside the prefix."""
    for target in pristine.targets:
        case.watch.events()
        try:
            _mutate_bytes(case.run / target, ("link_outside", None), case.outside)
            _check_load(pristine, case, exact=True)
        finally:
            case.restore()
