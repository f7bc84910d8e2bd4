"""A user error never shows a traceback: one line on stderr naming what is wrong and the
fix, a documented exit code, and with ``--json`` an ``{"error": ...}`` document on
stdout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import Cli

import ckptstore
from ckptstore.cli._common import EXIT_ERROR, EXIT_NOT_FOUND, EXIT_USAGE

ROOT = Path(__file__).resolve().parents[2]


def one_line_error(err: str) -> str:
    """The ``ckptstore: error: ...`` line of ``err``; fails on a traceback."""
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("ckptstore: error: ")]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("url", ["s3://bucket/run", "gs://bucket/run"])
@pytest.mark.parametrize("value", ["5", "localhost:9000"])
def test_an_endpoint_that_is_not_a_url_is_named_before_any_request(
    cli: Cli, url: str, value: str
) -> None:
    """``-o endpoint_url=5`` parses as a number and ``localhost:9000`` lacks its scheme:
    refused when the storage is opened, naming the option, not after retries against a
    host that cannot exist."""
    result = cli("ls", url, "-o", f"endpoint_url={value}")
    assert result.code == EXIT_ERROR
    line = one_line_error(result.err)
    assert "endpoint_url must be a URL with its scheme" in line
    assert "correct the value of -o endpoint_url=..." in line


@pytest.mark.parametrize("path_type", ["s3", "gcs"])
def test_a_local_path_forced_onto_an_object_store_is_refused_at_once(
    cli: Cli, tmp_path: Path, path_type: str
) -> None:
    """``--path-type gcs /tmp/run`` names the mistake instead of retrying requests to a
    bucket called ``tmp`` (it took about 10 s to fail)."""
    result = cli("ls", str(tmp_path), "--path-type", path_type)
    assert result.code == EXIT_ERROR
    line = one_line_error(result.err)
    assert "is a local path, not an object store URL" in line
    assert "drop the path type" in line


def test_a_misspelt_storage_option_is_named_with_the_closest_accepted_one(
    cli: Cli, run_url: str
) -> None:
    result = cli("ls", run_url, "-o", "durabilty=fsync")
    assert result.code == EXIT_ERROR
    line = one_line_error(result.err)
    assert "-o durabilty='fsync'" in line
    assert "did you mean -o durability=...?" in line
    assert result.out == ""


def test_an_unknown_storage_option_lists_the_accepted_ones(cli: Cli, run_url: str) -> None:
    line = one_line_error(cli("verify", run_url, "-o", "region=eu").err)
    # the value of an option the path type does not know is not echoed: it may be a
    # credential under a mistyped name
    assert "-o region=*** refused" in line
    assert "remove -o region (options 'local' accepts: direct_io, durability)" in line


def test_a_bad_storage_option_value_is_named(cli: Cli, run_url: str) -> None:
    result = cli("ls", run_url, "-o", "durability=fast")
    assert result.code == EXIT_ERROR
    line = one_line_error(result.err)
    assert "-o durability='fast'" in line
    assert "durability must be one of" in line


def test_an_option_without_a_value_is_a_usage_error(cli: Cli, run_url: str) -> None:
    result = cli("ls", run_url, "-o", "anon")
    assert result.code == EXIT_USAGE
    assert "'anon' is not KEY=VALUE" in one_line_error(result.err)


def test_options_of_each_side_of_cp_are_named_by_their_flag(
    cli: Cli, run_url: str, tmp_path: Path
) -> None:
    result = cli("cp", run_url, str(tmp_path / "copy"), "--dst-option", "durabilty=none")
    assert result.code == EXIT_ERROR
    assert "did you mean --dst-option durability=...?" in one_line_error(result.err)


@pytest.mark.parametrize(
    ("argv", "suggested"),
    [
        (["lss", "."], "did you mean ls?"),
        (["verfy", "."], "did you mean verify?"),
        (["ls", ".", "--jsn"], "did you mean --json?"),
        (["cp", "a", "b", "--forse"], "did you mean --force?"),
        (["--verison"], "did you mean --version?"),
    ],
)
def test_mistyped_commands_and_options_get_a_suggestion(
    cli: Cli, argv: list[str], suggested: str
) -> None:
    result = cli(*argv)
    assert result.code == EXIT_USAGE
    assert suggested in one_line_error(result.err)
    assert "usage: ckptstore" in result.err


@pytest.mark.parametrize(
    "argv",
    [
        ["ls"],
        ["gc", "--keep-last", "2"],
        ["catalog", "rebuild"],
        ["catalog", "rebuild", "--kind", "sqlite"],
    ],
    ids=["ls", "gc", "catalog-rebuild", "catalog-rebuild-sqlite"],
)
def test_a_missing_local_path_exits_4_and_creates_nothing(
    cli: Cli, tmp_path: Path, argv: list[str]
) -> None:
    """A mistyped root is an error, not an empty checkpoint: gc and a catalog rebuild
    do not report success there (nor create the directory, a sqlite catalog in it)."""
    nowhere = tmp_path / "nowhere"
    result = cli(*_with_url(argv, str(nowhere)))
    assert result.code == EXIT_NOT_FOUND
    assert "nothing at" in one_line_error(result.err)
    assert "no such directory" in result.err
    assert result.out == ""
    assert not nowhere.exists()


def _with_url(argv: list[str], url: str) -> list[str]:
    """``argv`` with ``url`` after the command's name (``catalog rebuild`` has two)."""
    words = 2 if argv[0] == "catalog" else 1
    return [*argv[:words], url, *argv[words:]]


def test_json_errors_are_json_on_stdout_and_text_on_stderr(cli: Cli, tmp_path: Path) -> None:
    cases = [
        (["ls", str(tmp_path / "nowhere"), "--json"], EXIT_NOT_FOUND),
        (["inspect", str(tmp_path), "--json"], EXIT_NOT_FOUND),
        (["verify", str(tmp_path), "--json", "-o", "nope=1"], EXIT_ERROR),
        (["ls", "nosuchscheme://bucket/x", "--json"], EXIT_ERROR),
        (["ls", str(tmp_path), "--json", "--jsno"], EXIT_USAGE),
    ]
    for argv, code in cases:
        result = cli(*argv)
        assert result.code == code, argv
        error = json.loads(result.out)["error"]
        assert error["exit_code"] == code
        assert error["message"] in one_line_error(result.err)


def test_an_unparsable_environment_variable_is_named(
    cli: Cli, run_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CKPTSTORE_IO_CONCURRENCY", "four")
    result = cli("verify", run_url, "--json")
    assert result.code == EXIT_ERROR
    line = one_line_error(result.err)
    assert "CKPTSTORE_IO_CONCURRENCY='four'" in line
    assert "unset CKPTSTORE_IO_CONCURRENCY" in line
    assert json.loads(result.out)["error"]["type"] == "EnvironmentVariableError"


def test_an_invalid_durability_variable_is_named(
    cli: Cli, run_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CKPTSTORE_DURABILITY", "fast")
    line = one_line_error(cli("ls", run_url).err)
    assert "CKPTSTORE_DURABILITY='fast'" in line
    assert "one of fsync, none, syncfs" in line


def test_a_demo_that_cannot_save_exits_1(cli: Cli) -> None:
    # /proc reads as empty (no checkpoint to resume) and refuses every write, even root's
    result = cli("demo", "--dir", "/proc/ckptstore-demo", "--epochs", "1")
    assert result.code == EXIT_ERROR
    error = one_line_error(result.err)
    assert "could not create the checkpoint directory /proc/ckptstore-demo" in error
    assert "Retrying cannot fix this" in error
    # stopped before the first save: no retries, no per-epoch warnings
    assert "Unable to write checkpoint" not in result.err
    assert "FAILED" not in result.out


def test_a_demo_whose_later_saves_fail_exits_1_and_says_so(cli: Cli, small_disk: Path) -> None:
    """The 2 MiB disk holds the first checkpoint only: the later saves fail (counted, not
    fatal: training goes on), and the demo still exits 1, naming the newest checkpoint
    it kept; its last line reports the model's accuracy and the failed epochs."""
    result = cli("demo", "--dir", str(small_disk / "ckpt"), "--epochs", "2")
    assert result.code == EXIT_ERROR
    error = one_line_error(result.err)
    assert "trained to epoch 2 but the newest checkpoint" in error
    assert "is epoch 0: saving failed" in error
    assert "checkpoint FAILED" in result.out
    done = [line for line in result.out.splitlines() if line.startswith("done: ")]
    assert done == [done[0]]
    assert "accuracy 0.00%" not in done[0]
    assert "The checkpoints of epoch(s) [1, 2] failed" in done[0]


def test_a_demo_on_a_read_only_filesystem_exits_1_with_one_line(cli: Cli, small_disk: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    result = cli("demo", "--dir", str(small_disk / "ckpt"), "--epochs", "2")
    assert result.code == EXIT_ERROR
    error = one_line_error(result.err)
    assert "EROFS" in error
    assert "remount it read-write" in error
    assert result.err.strip() == error  # nothing else: no retries, no per-epoch warnings


def test_a_demo_dir_that_cannot_be_read_exits_1(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"not a directory")
    result = cli("demo", "--dir", str(tmp_path / "file" / "ckpt"), "--epochs", "1")
    assert result.code == EXIT_ERROR
    assert "could not create the checkpoint directory" in one_line_error(result.err)


def test_version(cli: Cli, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli("--version")
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"ckptstore {ckptstore.__version__}"


def test_as_a_process_a_user_error_is_one_line(tmp_path: Path) -> None:
    """The real entry point (``python -m``), so nothing in-process hides a traceback."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    result = subprocess.run(
        [sys.executable, "-m", "ckptstore.cli", "ls", str(tmp_path), "-o", "x=1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert result.returncode == EXIT_ERROR
    assert "-o x=*** refused" in one_line_error(result.stderr)  # an unknown option's value: hidden


@pytest.mark.parametrize("value", ["-1", "abc", "1.0", "True", "9223372036854775808"])
@pytest.mark.parametrize(
    "argv",
    [["verify", "{url}"], ["inspect", "{url}"], ["cp", "{url}", "{dst}"], ["convert", "{url}"]],
    ids=["verify", "inspect", "cp", "convert"],
)
def test_an_epoch_option_that_is_not_an_epoch_is_a_usage_error(
    cli: Cli, run_url: str, tmp_path: Path, argv: list[str], value: str
) -> None:
    """Before: ``--epoch -1`` said "epoch -1 is not committed" (exit 4), as if it might
    have been."""
    dst = tmp_path / "copy"
    words = [word.format(url=run_url, dst=dst) for word in argv]
    if argv[0] == "convert":
        words += ["--to", "zarr"]
    result = cli(*words, f"--epoch={value}")
    assert result.code == EXIT_USAGE
    line = one_line_error(result.err)
    assert f"argument --epoch: '{value}' is not an epoch" in line
    assert "non-negative integer" in line
    assert not dst.exists()


def test_an_epoch_option_takes_a_plain_integer(cli: Cli, run_url: str) -> None:
    assert cli("verify", run_url, "--epoch", "2").code == 0
    assert cli("inspect", run_url, "--epoch", "2").code == 0


@pytest.mark.parametrize(
    "argv",
    [["ls"], ["gc", "--keep-last", "1"], ["catalog", "rebuild"]],
    ids=["ls", "gc", "catalog-rebuild"],
)
def test_a_file_where_a_root_is_expected_is_named_as_a_file(
    cli: Cli, run_url: str, tmp_path: Path, argv: list[str]
) -> None:
    """``ckptstore ls run/trainer_0.1/attempt-<id>/blobs.npz`` is a file, not a missing
    directory: the message says so and names the root to pass instead (exit 4: no
    checkpoint root there)."""
    inside = next(Path(run_url).glob("trainer_0.1/attempt-*/*"))
    result = cli(*_with_url(argv, str(inside)))
    assert result.code == EXIT_NOT_FOUND
    line = one_line_error(result.err)
    assert f"{inside} is a file, not a checkpoint root" in line
    assert f"pass the checkpoint root it belongs to, {run_url}" in line
    alone = tmp_path / "notes.txt"
    alone.write_text("not a checkpoint")
    line = one_line_error(cli(*_with_url(argv, str(alone))).err)
    assert f"{alone} is a file, not a checkpoint root" in line
    assert f"pass the directory that holds the checkpoints (this file is in {tmp_path})" in line
    assert alone.read_text() == "not a checkpoint"
