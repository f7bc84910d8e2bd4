"""No credential given on the command line is ever printed: not in an error, a hint, a
JSON document or a log line, on local paths and object stores alike. Each test passes a
unique secret and searches everything the run printed for it."""

from __future__ import annotations

import json
import logging
import os
import secrets
import subprocess
import sys
import traceback
from pathlib import Path

import pytest
from cli_helpers import Cli

from ckptstore.checkpoint._manager import CheckpointManager
from ckptstore.cli._common import EXIT_ERROR, EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE
from ckptstore.execution._session import LocalSession
from ckptstore.object_store._masking import masking_logs
from ckptstore.testing.fixtures import s3_server, s3_url
from ckptstore.testing.servers import free_port

__all__ = ["s3_server", "s3_url"]  # the fixtures this module uses

SECRET = f"SeCrEt-{secrets.token_hex(8)}"
ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}


@pytest.fixture
def printed(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG)
    return caplog


def assert_hidden(*texts: str) -> None:
    for text in texts:
        assert SECRET not in text
        assert SECRET[7:] not in text  # not even its random part


def local_cases(url: str) -> list[list[str]]:
    return [
        ["ls", url, "-o", "bogus_option=1", "-o", f"secret={SECRET}"],
        ["ls", url, "-o", f"password={SECRET}"],
        ["ls", url, "-o", f"pasword={SECRET}"],  # misspelt, unknown: masked too
        ["inspect", url, "-o", f"token={SECRET}", "--json"],
        ["verify", url, "-o", f'client_kwargs={{"aws_secret_access_key": "{SECRET}"}}'],
        ["gc", url, "--keep-last", "1", "-o", f"credentials={SECRET}"],
        ["cp", url, f"{url}-copy", "--dst-option", f"api_key={SECRET}"],
        ["ls", f"memory://user:{SECRET}@host/run"],
        ["ls", f"memory://host/run?sig={SECRET}"],
    ]


def test_no_secret_in_any_local_command(
    cli: Cli, run_url: str, printed: pytest.LogCaptureFixture
) -> None:
    for argv in local_cases(run_url):
        result = cli(*argv)
        assert result.code in (EXIT_ERROR, EXIT_NOT_FOUND), argv
        assert_hidden(result.out, result.err, printed.text)
        assert "Traceback" not in result.err


def test_no_secret_from_an_object_store(
    cli: Cli, s3_url: str, run_url: str, printed: pytest.LogCaptureFixture
) -> None:
    refused = cli("ls", s3_url, "-o", "bogus_option=1", "-o", f"secret={SECRET}")
    assert refused.code == EXIT_ERROR
    # the hint names the option that is wrong, not the (accepted) secret
    assert refused.err.rstrip().endswith("remove -o bogus_option")
    assert "-o secret=*** refused" in refused.err
    misspelt = cli("ls", s3_url, "-o", f"secert={SECRET}")
    assert "-o secert is unknown: did you mean -o secret=...?" in misspelt.err
    nested = cli("ls", s3_url, "-o", f'client_kwargs={{"aws_session_token": "{SECRET}"}}')
    # works: the options go to the server
    copied = cli(
        "cp", run_url, s3_url, "--dst-option", "key=ckpt-key-id", "--dst-option", f"secret={SECRET}"
    )
    assert copied.code == EXIT_OK
    listed = cli("ls", s3_url, "-o", f"secret={SECRET}", "-o", "key=ckpt-key-id", "--nodes")
    assert listed.code == EXIT_OK
    unreachable = cli(
        "ls",
        "s3://bucket/run",
        "-o",
        f"endpoint_url=http://127.0.0.1:{free_port()}",
        "-o",
        "retries=0",
        "-o",
        f"secret={SECRET}",
        "-o",
        f"key={SECRET}",
    )
    assert unreachable.code == EXIT_ERROR
    for result in (refused, misspelt, nested, copied, listed, unreachable):
        assert_hidden(result.out, result.err, printed.text)


@pytest.mark.parametrize(
    "argv",
    [
        ["ls", "{url}", f"secret={SECRET}"],  # -o forgotten
        ["ls", "{url}", "-o", f"={SECRET}"],  # no KEY
        ["ls", "{url}", f"--option=secret={SECRET}", "--jsn", "extra"],
        ["ls", "{url}", f"--secret={SECRET}", "-o"],
        ["ls", "{url}", "extra", "-o", f'client_kwargs={{"aws_secret_access_key": "{SECRET}"}}'],
        ["ls", "{url}", f"ftp://user:{SECRET}@host/run"],  # a second URL
        ["cp", "{url}", f"memory://user:{SECRET}@host/run", "--forse"],
    ],
)
def test_no_secret_in_a_usage_error(cli: Cli, run_url: str, argv: list[str]) -> None:
    result = cli(*[word.replace("{url}", run_url) for word in argv], "--json")
    assert result.code == EXIT_USAGE
    assert result.json()["error"]["type"] == "UsageError"
    assert_hidden(result.out, result.err)


def test_no_secret_as_a_process(run_url: str, tmp_path: Path) -> None:
    """Everything the process writes, log lines through logging's last resort included."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "ckptstore.cli",
            "ls",
            run_url,
            "-o",
            "bogus_option=1",
            "-o",
            f"secret={SECRET}",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=ENV,
    )
    assert result.returncode == EXIT_ERROR
    assert json.loads(result.stdout)["error"]["type"] == "StorageOptionError"
    assert_hidden(result.stdout, result.stderr)


def test_log_lines_are_masked_while_a_command_runs(printed: pytest.LogCaptureFixture) -> None:
    with masking_logs([SECRET]):
        logging.getLogger("ckptstore.somewhere").warning("refused key %s", SECRET)
        try:
            raise ValueError(f"bad {SECRET}")
        except ValueError:
            logging.getLogger("ckptstore.somewhere").exception("failed")
    logging.getLogger("ckptstore.somewhere").warning("after: %s", "visible")
    assert "refused key ***" in printed.text
    assert "bad ***" in printed.text
    assert "after: visible" in printed.text
    assert_hidden(printed.text, *(record.getMessage() for record in printed.records))


@pytest.mark.parametrize(
    ("url", "options"),
    [
        ("{tmp}/run", {"bogus_option": 1, "secret": SECRET}),
        ("{tmp}/run", {"password": SECRET}),
        ("s3://bucket/run", {"bogus_option": 1, "secret": SECRET, "key": SECRET}),
        ("s3://bucket/run", {"client_kwargs": 3, "token": SECRET}),
    ],
)
def test_a_library_save_with_bad_options_prints_no_secret(
    tmp_path: Path, url: str, options: dict[str, object], printed: pytest.LogCaptureFixture
) -> None:
    def save() -> None:
        session = LocalSession()
        session.workspace("trainer_0")["w"] = [1.0]
        manager = CheckpointManager(
            url.format(tmp=tmp_path), "trainer_0", "npz", storage_options=options
        )
        session.run(manager.init(["trainer_0"]))
        session.run(manager.save(1))

    with pytest.raises((TypeError, ValueError)) as raised:
        save()
    assert_hidden(str(raised.value), "".join(traceback.format_exception(raised.value)))
    assert_hidden(printed.text)


def test_log_lines_are_masked_without_any_logging_configured(tmp_path: Path) -> None:
    """The CLI configures no logging: warnings reach stderr through logging's last
    resort handler, which is masked too."""
    script = (
        "import logging\n"
        "from ckptstore.object_store._masking import masking_logs\n"
        "with masking_logs([SECRET]):\n"
        "    logging.getLogger('ckptstore.x').warning('refused %s', SECRET)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", f"SECRET = {SECRET!r}\n{script}"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=ENV,
    )
    assert result.stderr == "refused ***\n"
