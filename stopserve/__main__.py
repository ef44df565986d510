"""``python -m stopserve``: the ``stopserve`` command."""

from stopserve.cli import main

raise SystemExit(main())
