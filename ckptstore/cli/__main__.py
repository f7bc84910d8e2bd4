"""``python -m ckptstore.cli``: the same as the ``ckptstore`` command."""

from ckptstore.cli._main import main

raise SystemExit(main())
