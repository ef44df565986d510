"""``python -m stopserve``: the same command as ``stopserve``."""

from stopserve.cli import main

raise SystemExit(main())
