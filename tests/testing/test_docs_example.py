"""The worked example of ``docs/testing.md`` passes when run the way users run it: as
its own file, in a fresh pytest process, with ``-p ckptstore.testing``."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "testing.md"


def worked_example() -> tuple[str, str]:
    """The (file name, code) of the documentation's example test file."""
    for block in re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL):
        first = block.splitlines()[0]
        if first.startswith("# test_") and first.endswith(".py"):
            return first[2:], block
    raise AssertionError(f"{DOC} has no ```python block starting with '# test_<name>.py'")


def test_the_worked_example_passes(tmp_path: Path) -> None:
    name, code = worked_example()
    (tmp_path / name).write_text(code)
    tests = len(re.findall(r"^def test_", code, flags=re.MULTILINE))
    assert tests >= 4
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "ckptstore.testing",
            "-p",
            "no:cacheprovider",
            "-q",
            name,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert f"{tests} passed" in output, output


def test_the_run_command_in_the_doc_names_the_example_file() -> None:
    name, _ = worked_example()
    assert f"pytest -p ckptstore.testing {name}" in DOC.read_text()
