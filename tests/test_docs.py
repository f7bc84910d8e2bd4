"""The plugin authors' guide documents every hook, and its example plugin works."""

from __future__ import annotations

import inspect
import re
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ckptstore import (
    Job,
    JobRunner,
    LocalSession,
    MultiNodeCheckpointManager,
    Node,
    Task,
    epoch_limiter,
)
from ckptstore.plugin import _spec as spec
from ckptstore.plugin._registry import Registry

DOCS = Path(__file__).resolve().parent.parent / "docs"
GUIDE = (DOCS / "plugins.md").read_text()


def hook_specs() -> list[types.FunctionType]:
    return [
        value
        for name, value in vars(spec).items()
        if name.startswith("ckptstore_") and inspect.isfunction(value)
    ]


def guide_section(hook_name: str) -> str:
    match = re.search(rf"^### `{hook_name}\((.*?)\)`\n(.*?)(?=^#)", GUIDE, re.M | re.S)
    assert match, f"docs/plugins.md has no '### `{hook_name}(...)`' section"
    return match.group(1) + match.group(2)


def test_the_spec_has_the_five_hooks() -> None:
    assert sorted(f.__name__ for f in hook_specs()) == [
        "ckptstore_db_types",
        "ckptstore_metadata_handlers",
        "ckptstore_path_types",
        "ckptstore_report",
        "ckptstore_upload_builders",
    ]


@pytest.mark.parametrize("hook", hook_specs(), ids=lambda f: f.__name__)
def test_every_hook_and_argument_is_documented(hook: types.FunctionType) -> None:
    section = guide_section(hook.__name__)
    for argument in inspect.signature(hook).parameters:
        assert argument in section, f"{hook.__name__}: argument {argument!r} is not documented"


def example_module() -> types.ModuleType:
    block = GUIDE.split("## A complete example", 1)[1].split("```python\n", 1)[1]
    source = block.split("```", 1)[0]
    module = types.ModuleType("ckptstore_example")
    exec(compile(source, "docs/plugins.md", "exec"), module.__dict__)
    return module


def test_the_example_implements_every_hook() -> None:
    module = example_module()
    for hook in hook_specs():
        assert hasattr(module, hook.__name__), f"the example lacks {hook.__name__}"


def test_the_cheap_import_example_is_a_passing_test() -> None:
    block = GUIDE.split("from ckptstore.testing import imported_modules", 1)[1]
    source = "from ckptstore.testing import imported_modules" + block.split("```", 1)[0]
    namespace: dict[str, object] = {}
    exec(compile(source, "docs/plugins.md", "exec"), namespace)
    test = namespace["test_registering_the_plugin_imports_no_http_client"]
    assert callable(test)
    test()


def counter_job() -> Job:
    with Job() as job, Node("trainer_0"):
        with job.init_group:
            Task(lambda ws: ws.update(count=np.zeros(3)), name="init")
        Task(lambda ws: ws["count"].__iadd__(1.0), name="count")
        epoch_limiter(job, 3)
    return job


def test_the_example_plugin_checkpoints_and_resumes(registry: Registry) -> None:
    module = example_module()
    registry.register(module, name="ckptstore_example")
    assert registry.db_types["rawfiles"].__name__ == "RawFilesDB"
    assert registry.path_type_for("scratch://run").name == "scratch"

    session = LocalSession()
    runner = JobRunner(
        counter_job(),
        MultiNodeCheckpointManager("scratch://run", "rawfiles", metadata_handler="in-memory"),
        upload_task_group_builder="note",
    )
    assert runner.train(session) == 3
    assert session.workspace("trainer_0")["uploaded_epoch"].item() == 3
    assert module.InMemoryCatalog.committed == [0, 1, 2, 3]
    assert ("checkpoint_save", ["trainer_0"]) in module.REPORTS

    resumed = LocalSession()
    manager = MultiNodeCheckpointManager("scratch://run", "rawfiles", metadata_handler="in-memory")
    rerun = JobRunner(counter_job(), manager)
    assert rerun.train(resumed) == 3
    assert ("checkpoint_load", ["trainer_0"]) in module.REPORTS
    # the job was finished: epoch 3 is restored and no further epoch runs
    assert rerun.already_finished
    assert resumed.workspace("trainer_0")["count"].tolist() == [3.0, 3.0, 3.0]


def test_the_readme_example_trains_then_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    readme = (DOCS.parent / "README.md").read_text()
    source = re.search(r"## In code\n\n```python\n(.*?)```", readme, re.S)
    assert source, "README.md lost its '## In code' example"
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {}
    exec(compile(source.group(1), "README.md", "exec"), namespace)
    assert (tmp_path / "ckpt" / "trainer_0.10").is_dir()
    assert namespace["runner"].resumed_from_epoch is None  # a fresh start
    assert np.allclose(namespace["w"], 1.0)  # ten epochs of += 0.1
    rerun: dict[str, Any] = {}
    exec(compile(source.group(1), "README.md", "exec"), rerun)  # finished: a rerun does nothing
    assert not (tmp_path / "ckpt" / "trainer_0.11").exists()
    assert rerun["runner"].resumed_from_epoch == 10
    assert np.array_equal(rerun["w"], namespace["w"])  # the trained state, read back
    longer = source.group(1).replace("epoch_limiter(job, 10)", "epoch_limiter(job, 12)")
    exec(compile(longer, "README.md", "exec"), {})  # a raised limit continues from 10
    assert (tmp_path / "ckpt" / "trainer_0.12").is_dir()
    assert not (tmp_path / "ckpt" / "trainer_0.13").exists()


def test_the_site_front_page_shows_the_readme_examples_as_tested() -> None:
    """docs/index.md (the site's front page) shows the README's examples, which the tests
    above run; a copy that drifted would show code nothing runs."""
    readme = (DOCS.parent / "README.md").read_text()
    front = (DOCS / "index.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", front, re.S)
    assert len(blocks) == 2
    for block in blocks:
        assert block in readme, f"docs/index.md shows code the README does not:\n{block}"
