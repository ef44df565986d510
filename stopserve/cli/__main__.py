"""``python -m stopserve.cli``: the same command as ``stopserve``."""

from stopserve.cli import main

raise SystemExit(main())
