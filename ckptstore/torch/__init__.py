"""PyTorch state dicts, saved bit-exactly and without pickle.

Models, optimizers and anything with ``state_dict()`` are saved through the tree API
(:mod:`ckptstore.tree`), zero-copy where numpy has the dtype. Install it with
``pip install '.[torch]'``.

Sharded state goes through ``torch.distributed.checkpoint`` with ckptstore as its
storage: :mod:`ckptstore.torch.dcp` (``Writer``, ``Reader``).

Sits above :mod:`ckptstore.tree`; nothing else in ckptstore imports torch.

Example::

    >>> import torch
    >>> from ckptstore.torch import restore, save
    >>> model = torch.nn.Linear(3, 1)
    >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    >>> save("./ckpt", 7, model=model, optimizer=optimizer)
    >>> twin = torch.nn.Linear(3, 1)
    >>> restore("./ckpt", model=twin, optimizer=torch.optim.SGD(twin.parameters(), lr=0.5))
    7
    >>> torch.equal(twin.weight, model.weight)  # bit-exact, no pickle
    True
"""

from ckptstore.torch._adapter import TorchAdapter
from ckptstore.torch._state import Stateful, load_state, restore, save, save_state

__all__ = ["Stateful", "TorchAdapter", "load_state", "restore", "save", "save_state"]
