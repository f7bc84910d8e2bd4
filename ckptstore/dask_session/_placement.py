"""Which Dask worker holds each node: an explicit mapping, else a stable assignment.

A node is pinned to one worker the first time it is placed and stays there for the
session's lifetime. Explicit mappings name a worker by address (``tcp://10.0.0.5:4000``)
or by the name it was started with (``dask worker --name trainer-host-0``). Other
nodes go, in the order they are first used, to the live worker holding the fewest of
this session's nodes (ties broken by worker name, then address), so the same job on
the same workers gets the same placement, and N nodes spread evenly over M workers.

Example::

    >>> placement = NodePlacement({"trainer_0": "gpu-host-0"})
    >>> placement.place("trainer_0", {"tcp://10.0.0.5:4000": "gpu-host-0"})
    'tcp://10.0.0.5:4000'
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from ckptstore.errors import JobConfigurationError
from ckptstore.records import validate_node_name

__all__ = ["NodePlacement"]


class NodePlacement:
    """Pins node names to worker addresses.

    ``live`` arguments map each live worker's address to its name.

    Example::

        >>> placement = NodePlacement()
        >>> placement.place("trainer_0", {"tcp://a:1": "0", "tcp://b:1": "1"})
        'tcp://a:1'
        >>> placement.place("trainer_1", {"tcp://a:1": "0", "tcp://b:1": "1"})
        'tcp://b:1'
    """

    def __init__(self, node_to_worker: Mapping[str, str] | None = None) -> None:
        self._requested = {
            validate_node_name(str(node)): str(worker)
            for node, worker in (node_to_worker or {}).items()
        }
        self._pinned: dict[str, str] = {}

    def pinned(self) -> dict[str, str]:
        """``{node: worker address}`` for every node placed so far."""
        return dict(self._pinned)

    def worker_of(self, node: str) -> str | None:
        """The address ``node`` is pinned to, if it has been placed."""
        return self._pinned.get(node)

    def is_explicit(self, node: str) -> bool:
        """Whether the user mapped ``node`` to a worker."""
        return node in self._requested

    def place(self, node: str, live: Mapping[str, str]) -> str:
        """Pin ``node`` (if not pinned yet) and return its worker's address."""
        address = self._pinned.get(node)
        if address is not None:
            return address
        requested = self._requested.get(node)
        address = self._resolve(node, requested, live) if requested else self._least_loaded(live)
        self._pinned[node] = address
        return address

    def unpin(self, node: str) -> None:
        """Forget where ``node`` was (only for a node whose workspace was never created)."""
        self._pinned.pop(node, None)

    def _resolve(self, node: str, requested: str, live: Mapping[str, str]) -> str:
        if requested in live:
            return requested
        matches = [address for address, name in live.items() if name == requested]
        if len(matches) == 1:
            return matches[0]
        known = ", ".join(f"{name} ({address})" for address, name in sorted(live.items()))
        problem = "several workers are" if matches else "no worker is"
        raise JobConfigurationError(
            f"node {node!r} is mapped to worker {requested!r}, but {problem} known by that "
            f"address or name (workers: {known or 'none'}). Fix node_to_worker, give workers "
            "unique names (`dask worker --name ...`), or wait for the worker with "
            "client.wait_for_workers(n)."
        )

    def _least_loaded(self, live: Mapping[str, str]) -> str:
        if not live:
            raise JobConfigurationError(
                "the Dask cluster has no workers to place nodes on: start workers, or call "
                "client.wait_for_workers(n) before running the job"
            )
        load = Counter(address for address in self._pinned.values() if address in live)
        return min(live, key=lambda address: (load[address], live[address], address))
