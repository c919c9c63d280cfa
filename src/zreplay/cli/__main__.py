"""``python -m zreplay.cli ...``: the same as the ``zreplay`` console script."""

from . import main

raise SystemExit(main())
