"""``imported_modules``: what a script imports, asked of a fresh interpreter."""

from __future__ import annotations

import pytest

from ckptstore.testing import imported_modules


def test_reports_only_the_watched_packages_the_script_imported() -> None:
    script = "import email.message\nprint('ckptstore.testing.imported_modules: a decoy')\n"
    assert imported_modules(script, ["numpy", "email", "email"]) == ["email"]


def test_a_failing_script_fails_the_test_with_its_error_output() -> None:
    with pytest.raises(AssertionError, match="ZeroDivisionError"):
        imported_modules("1 / 0", ["email"])
