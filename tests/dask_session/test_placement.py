"""Node placement: explicit mappings by address or name, else an even, stable spread."""

from __future__ import annotations

import pytest

from ckptstore.dask_session._placement import NodePlacement
from ckptstore.errors import InvalidNameError, JobConfigurationError

LIVE = {"tcp://10.0.0.7:4000": "b", "tcp://10.0.0.5:4000": "a", "tcp://10.0.0.6:4000": "c"}


def test_nodes_spread_evenly_in_first_use_order() -> None:
    placement = NodePlacement()
    placed = [placement.place(f"trainer_{i}", LIVE) for i in range(5)]
    # by load, then worker name: a, b, c, then a and b again
    assert placed == [
        "tcp://10.0.0.5:4000",
        "tcp://10.0.0.7:4000",
        "tcp://10.0.0.6:4000",
        "tcp://10.0.0.5:4000",
        "tcp://10.0.0.7:4000",
    ]


def test_the_same_nodes_on_the_same_workers_get_the_same_placement() -> None:
    first, second = NodePlacement(), NodePlacement()
    nodes = ["trainer_0", "trainer_1", "local"]
    assert [first.place(n, LIVE) for n in nodes] == [second.place(n, dict(LIVE)) for n in nodes]


def test_a_node_stays_pinned() -> None:
    placement = NodePlacement()
    address = placement.place("trainer_0", LIVE)
    assert placement.place("trainer_0", {"tcp://other:1": "z"}) == address
    assert placement.worker_of("trainer_0") == address
    assert placement.pinned() == {"trainer_0": address}
    placement.unpin("trainer_0")
    assert placement.worker_of("trainer_0") is None


def test_explicit_mappings_by_address_or_by_name() -> None:
    placement = NodePlacement({"trainer_0": "tcp://10.0.0.6:4000", "trainer_1": "c"})
    assert placement.place("trainer_0", LIVE) == "tcp://10.0.0.6:4000"
    assert placement.place("trainer_1", LIVE) == "tcp://10.0.0.6:4000"
    assert placement.is_explicit("trainer_1")
    assert not placement.is_explicit("trainer_2")
    # unmapped nodes avoid the worker the mapped ones loaded
    assert placement.place("trainer_2", LIVE) == "tcp://10.0.0.5:4000"


def test_a_mapping_to_a_missing_worker_lists_the_workers() -> None:
    placement = NodePlacement({"trainer_0": "gpu-9"})
    with pytest.raises(JobConfigurationError) as failure:
        placement.place("trainer_0", LIVE)
    message = str(failure.value)
    assert "'trainer_0' is mapped to worker 'gpu-9'" in message
    assert "a (tcp://10.0.0.5:4000)" in message
    assert "wait_for_workers" in message


def test_a_name_shared_by_two_workers_is_ambiguous() -> None:
    placement = NodePlacement({"trainer_0": "gpu"})
    with pytest.raises(JobConfigurationError, match="several workers are known"):
        placement.place("trainer_0", {"tcp://a:1": "gpu", "tcp://b:1": "gpu"})


def test_no_workers_at_all() -> None:
    with pytest.raises(JobConfigurationError, match="no workers"):
        NodePlacement().place("trainer_0", {})


def test_node_names_are_validated() -> None:
    with pytest.raises(InvalidNameError):
        NodePlacement({"../escape": "a"})
