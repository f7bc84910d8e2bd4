"""Trees of arrays, saved and loaded as one committed checkpoint without a Job.

A tree is nested dicts, lists and tuples of arrays and Python scalars: a pytree API for
any framework.

May import :mod:`ckptstore.checkpoint` (managers, for their location),
:mod:`ckptstore.protocol` and below; :mod:`ckptstore.torch` builds on it.

Example::

    >>> from ckptstore.tree import load_tree, save_tree
    >>> save_tree("./ckpt", 3, {"params": {"w": np.ones(4, np.float32)}, "step": 3})
    >>> load_tree("./ckpt")
    {'params': {'w': array([1., 1., 1., 1.], dtype=float32)}, 'step': 3}
"""

from ckptstore.tree._flatten import (
    ArrayAdapter,
    Spec,
    decode_segment,
    encode_segment,
    flatten,
    unflatten,
)
from ckptstore.tree._store import SPEC_BLOB, TreeTarget, latest_tree_epoch, load_tree, save_tree

__all__ = [
    "SPEC_BLOB",
    "ArrayAdapter",
    "Spec",
    "TreeTarget",
    "decode_segment",
    "encode_segment",
    "flatten",
    "latest_tree_epoch",
    "load_tree",
    "save_tree",
    "unflatten",
]
