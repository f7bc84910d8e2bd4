"""benchmarks.dcp's report: medians, ratios against each peer, resharded loads."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from benchmarks.dcp import Row, table


def test_the_table_gives_medians_and_ratios() -> None:
    ours = Row("ckptstore", save=[1.0, 2.0, 9.0], blocked=[0.1], async_total=[3.0])
    ours.loads = {"2>2": [4.0], "2>1": [2.0], "2>4": [6.0], "4>4": [5.0], "4>2": [6.0]}
    ours.read = {"2>2": 1.0, "2>1": 1.0, "2>4": 1.5, "4>4": 1.0, "4>2": 1.05}
    peer = Row("DCP", save=[3.0], blocked=[0.2], async_total=[4.0], loads={"2>2": [2.0]})
    lines = table([ours, peer], 1 << 30)
    assert lines[2].startswith("| ckptstore | 2.00 | 0.10 | 3.00 | 4.00 | 2.00 | 6.00 | 5.00 |")
    assert "ckptstore saves 1.50x as fast, loads (2 -> 2) 0.50x as fast" in lines[5]
    assert "2 -> 1: 0.50x the time of the 2 -> 2 load, reading 1.00x" in lines[6]
    assert "2 -> 4: 1.50x the time of the 2 -> 2 load, reading 1.50x" in lines[7]
    assert "4 -> 2: 1.20x the time of the 4 -> 4 load, reading 1.05x" in lines[8]
    assert lines[3].endswith("| -, -, -, -, - |")  # bytes read not measured for the peer


def test_write_options_reach_the_writer_only() -> None:
    """The sweep's upload settings (whole files for s3fs, whole objects for ckptstore)
    are the writers' own; the readers get the shared options alone."""
    import boto3

    from benchmarks.dcp import WHOLE_OBJECTS, Storage, s3_options
    from ckptstore.testing import in_process_moto

    with in_process_moto() as moto:
        boto3.client("s3", endpoint_url=moto.endpoint_url).create_bucket(Bucket="bench")
        options = s3_options(moto.endpoint_url)
        theirs = Storage("DCP", "fsspec", "s3://bench/x", options, 2, {"default_block_size": 7})
        assert theirs.writer(1).fs.fs.default_block_size == 7
        assert theirs.reader(1).fs.fs.default_block_size != 7
        whole = {"multipart_threshold": WHOLE_OBJECTS}
        ours = Storage("ckptstore", "ckptstore", "s3://bench/ours", options, 1, whole)
        assert ours.writer(1).storage.options.multipart_threshold == WHOLE_OBJECTS
        assert "multipart_threshold" not in options


def test_the_settings_swept_make_one_line_named_by_storage() -> None:
    from benchmarks.dcp import sweep_lines

    assert sweep_lines({}) == []  # nothing swept (smoke, or --threads): no line
    swept = {"DCP, 1 threads": 2.0, "ckptstore, whole objects": 1.234}
    assert sweep_lines(swept) == [
        "* settings swept (median save s): DCP, 1 threads: 2.00; ckptstore, whole objects: 1.23"
    ]
