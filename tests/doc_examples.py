"""Running the Python examples of a Markdown page as a pytest module, in a subprocess."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs"
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.M | re.S)


def python_blocks(page: str) -> list[str]:
    """The ```python blocks of ``docs/<page>``, in order."""
    return _BLOCK.findall((DOCS / page).read_text())


def run_as_test_module(page: str, directory: Path) -> subprocess.CompletedProcess[str]:
    """Write the page's blocks as ``test_<page>.py`` in ``directory`` and run pytest on
    it there (module-level examples run at import; test classes run as tests)."""
    module = directory / f"test_{Path(page).stem}_examples.py"
    module.write_text("\n\n".join(python_blocks(page)))
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(module)],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
