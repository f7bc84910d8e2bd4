"""The operator commands end to end on a moto S3 server (``s3_url`` gives a fresh
bucket, usable with no options)."""

from __future__ import annotations

from ckpt_helpers import data_key
from cli_helpers import Cli

from ckptstore import protocol
from ckptstore.plugin._registry import get_registry
from ckptstore.testing.conformance import NODES, flip_byte
from ckptstore.testing.fixtures import s3_server, s3_url

__all__ = ["s3_server", "s3_url"]  # the fixtures this module uses


def test_every_command_works_on_s3(cli: Cli, s3_url: str, run_url: str) -> None:
    assert cli("cp", run_url, s3_url, "--jobs", "2").code == 0

    listing = cli("ls", s3_url, "--json").json()
    (run,) = listing["runs"]
    assert [(e["epoch"], e["state"]) for e in run["epochs"]] == [
        (epoch, "committed") for epoch in range(4)
    ]
    described = cli("inspect", s3_url, "--epoch", "3", "--json").json()
    assert [node["node"] for node in described["nodes"]] == list(NODES)
    assert cli("verify", s3_url).code == 0

    assert cli("convert", s3_url, "--to", "zarr", "--latest").code == 0
    storage = get_registry().open_path(s3_url)
    assert protocol.open_node(storage, "trainer_1", 3).db_type == "zarr"
    assert cli("verify", s3_url, "--latest").code == 0
    assert cli("verify", s3_url, "--deep").code == 0  # npz and zarr archives, ranged reads

    lmdb = cli("convert", s3_url, "--to", "lmdb", "--latest")
    assert lmdb.code == 1
    assert "local" in lmdb.err
    assert protocol.open_node(storage, "trainer_1", 3).db_type == "zarr"

    gc = cli("gc", s3_url, "--keep-last", "1", "--keep-every", "2")
    assert gc.code == 0
    assert [e["epoch"] for e in cli("ls", s3_url, "--json").json()["runs"][0]["epochs"]] == [
        0,
        2,
        3,
    ]

    chunk = protocol.open_node(storage, "trainer_0", 2).blobs["trainer_0/w"].chunks[0]
    flip_byte(storage, f"{data_key(storage, 'trainer_0', 2)}/{chunk.key}", chunk.offset)
    broken = cli("verify", s3_url)
    assert broken.code == 3
    assert "blob 'trainer_0/w'" in broken.out

    back = run_url + "-from-s3"
    assert cli("cp", s3_url, back, "--latest").code == 0
    assert cli("verify", back).code == 0
