"""Nodes: named places where tasks run, each with its own workspace."""

from __future__ import annotations

from ckptstore.execution._context import Current
from ckptstore.records import validate_node_name

__all__ = ["DEFAULT_NODE", "Node"]

DEFAULT_NODE = "local"


class Node(Current, context="ckptstore_node"):
    """A named node. Tasks created inside ``with Node(name):`` run on it.

    Only the name matters: a :class:`~ckptstore.LocalSession` gives every node its own
    in-process workspace, a ``DaskSession`` maps each node onto a Dask worker.

    Example::

        >>> with Node("trainer_0"):
        ...     Node.current()
        'trainer_0'
        >>> Node.current()  # "local" again out here
        'local'
    """

    def __init__(self, name: str = DEFAULT_NODE) -> None:
        self.name = validate_node_name(name)

    @staticmethod
    def current() -> str:
        """The name of the node tasks are bound to right now (``"local"`` by default)."""
        node = Node._innermost()
        return node.name if node is not None else DEFAULT_NODE

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"Node({self.name!r})"
