"""The operator commands on a GCS emulator (``gcs_url`` gives a fresh bucket)."""

from __future__ import annotations

from cli_helpers import Cli

from ckptstore.testing.conformance import NODES
from ckptstore.testing.fixtures import gcs_server, gcs_url

__all__ = ["gcs_server", "gcs_url"]  # the fixtures this module uses


def test_copy_list_inspect_verify_gc_on_gcs(cli: Cli, gcs_url: str, run_url: str) -> None:
    assert cli("cp", run_url, gcs_url, "--epoch", "2", "--epoch", "3").code == 0
    epochs = cli("ls", gcs_url, "--json").json()["runs"][0]["epochs"]
    assert [(e["epoch"], e["state"]) for e in epochs] == [(2, "committed"), (3, "committed")]
    described = cli("inspect", gcs_url, "--json").json()
    assert [node["node"] for node in described["nodes"]] == list(NODES)
    assert cli("verify", gcs_url).code == 0
    assert cli("gc", gcs_url, "--keep-last", "1").code == 0
    assert [e["epoch"] for e in cli("ls", gcs_url, "--json").json()["runs"][0]["epochs"]] == [3]
