"""Every ``Example::`` block in a docstring of ckptstore or a bundled plugin is a
doctest, and every doctest runs here, in a fresh temporary working directory with
``np`` (numpy), the module's own names and two server helpers in scope:

- ``s3_options(bucket)``: storage options for a fresh ``bucket`` on the session's moto
  S3 server (:class:`~ckptstore.testing.MotoServer`),
- ``gcs_options(bucket)``: the same on the session's GCS emulator
  (:class:`~ckptstore.testing.GcsEmulator`), with gcsfs's plain filesystem for ``gs://``.

A server starts only when an example first asks for it; the buckets are deleted after
the module's examples, so the examples show only the lines a user writes."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from ckptstore.errors import StorageError
from ckptstore.plugin import get_registry
from ckptstore.testing import GcsEmulator, MotoServer
from ckptstore.testing.fixtures import GCS_PROJECT, TEST_CREDENTIALS, use_plain_gcsfs

PACKAGES = ["ckptstore", "ckptstore_s3", "ckptstore_gcs", "ckptstore_lmdb", "ckptstore_prometheus"]


def module_names() -> list[str]:
    """Every module of the packages, sorted."""
    names: list[str] = []
    for package_name in PACKAGES:
        package = importlib.import_module(package_name)
        names.append(package_name)
        for info in pkgutil.walk_packages(package.__path__, prefix=f"{package_name}."):
            if not info.name.endswith("__main__"):  # importing it runs the CLI
                names.append(info.name)
    return sorted(names)


EXAMPLE_HEADING = re.compile(r"Example( \(.*\))?::$")
"""``Example::``, or ``Example (what it shows)::``, ending a line."""


def unrun_examples(source: str) -> int:
    """How many ``Example::`` blocks in ``source`` hold no ``>>>`` line."""
    lines = source.splitlines()
    unrun = 0
    for number, line in enumerate(lines):
        if not EXAMPLE_HEADING.search(line.rstrip()):
            continue
        indent = len(line) - len(line.lstrip())
        block: list[str] = []
        for following in lines[number + 1 :]:
            if following.strip() and len(following) - len(following.lstrip()) <= indent:
                break
            block.append(following)
        if not any(text.lstrip().startswith(">>>") for text in block):
            unrun += 1
    return unrun


def _source(module: ModuleType) -> str:
    assert module.__file__ is not None
    return Path(module.__file__).read_text()


MODULES = module_names()


def test_every_example_is_a_doctest() -> None:
    counts = {}
    for name in MODULES:
        unrun = unrun_examples(_source(importlib.import_module(name)))
        if unrun:
            counts[name] = unrun
    assert counts == {}, "these modules have Example:: blocks without a >>> line"


def test_the_unrun_example_count_sees_blocks() -> None:
    source = '"""Example::\n\n    f(1)\n\nExample::\n\n    >>> f(1)\n    2\n"""\n'
    assert unrun_examples(source) == 1
    assert unrun_examples('"""Example (a call)::\n\n    f(1)\n"""\n') == 1


ServerHelper = Callable[[str], dict[str, Any]]


@contextmanager
def server_helpers(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, ServerHelper]]:
    """``s3_options`` and ``gcs_options`` for the examples' namespace (see the module
    docstring); each bucket they create is deleted on exit."""
    made: list[tuple[MotoServer | GcsEmulator, str]] = []

    def fresh(server: MotoServer | GcsEmulator, bucket: str) -> MotoServer | GcsEmulator:
        """``bucket`` on ``server``, empty (again, when an earlier example made it)."""
        if (server, bucket) in made:
            server.delete_bucket(bucket)
        else:
            made.append((server, bucket))
        server.create_bucket(bucket)
        return server

    def s3_options(bucket: str) -> dict[str, Any]:
        server = fresh(request.getfixturevalue("s3_server"), bucket)
        return {
            "endpoint_url": server.endpoint_url,
            **TEST_CREDENTIALS,
            "client_kwargs": {"region_name": "us-east-1"},
        }

    def gcs_options(bucket: str) -> dict[str, Any]:
        use_plain_gcsfs(monkeypatch)  # the emulator has no gRPC API to probe
        server = fresh(request.getfixturevalue("gcs_server"), bucket)
        return {"endpoint_url": server.endpoint_url, "token": "anon", "project": GCS_PROJECT}

    try:
        yield {"s3_options": s3_options, "gcs_options": gcs_options}
    finally:
        for server, bucket in made:
            server.delete_bucket(bucket)


@pytest.mark.parametrize(("helper", "scheme"), [("s3_options", "s3"), ("gcs_options", "gs")])
def test_server_helpers_make_a_bucket_for_the_examples_only(
    helper: str, scheme: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    with server_helpers(request, monkeypatch) as helpers:
        options = helpers[helper]("helper-bucket")
        storage = get_registry().open_path(f"{scheme}://helper-bucket/run", **options)
        storage.write_bytes("a", b"x")
        assert storage.read_bytes("a") == b"x"
        assert helpers[helper]("helper-bucket") == options  # asked again: emptied
        assert storage.list_keys() == []
        storage.close()
    storage = get_registry().open_path(f"{scheme}://helper-bucket/run", **options)
    with pytest.raises(StorageError, match="helper-bucket"):  # deleted with its objects
        storage.write_bytes("a", b"x")
    storage.close()


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(
    name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    module = importlib.import_module(name)
    with server_helpers(request, monkeypatch) as helpers:
        globs = {**vars(module), "np": np, **helpers}
        tests = doctest.DocTestFinder(exclude_empty=True).find(module, globs=globs)
        if not any(test.examples for test in tests):
            return
        monkeypatch.chdir(tmp_path)
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
        for test in tests:
            runner.run(test)
        result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
