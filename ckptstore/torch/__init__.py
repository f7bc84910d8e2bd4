"""PyTorch state dicts in ckptstore (``pip install '.[torch]'``): models,
optimizers and anything with ``state_dict()``, saved bit-exactly without pickle through
the tree API (:mod:`ckptstore.tree`), zero-copy where numpy has the dtype.

Sits above :mod:`ckptstore.tree`; nothing else in ckptstore imports torch.

Example::

    from ckptstore.torch import restore, save

    save("./ckpt", epoch, model=model, optimizer=optimizer)
    epoch = restore("./ckpt", model=model, optimizer=optimizer)  # the newest epoch
"""

from ckptstore.torch._adapter import TorchAdapter
from ckptstore.torch._state import Stateful, load_state, restore, save, save_state

__all__ = ["Stateful", "TorchAdapter", "load_state", "restore", "save", "save_state"]
