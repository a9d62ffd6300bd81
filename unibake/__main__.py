"""``python -m unibake``: the same command line as ``build.py`` and the ``unibake`` command."""

import sys

from .cli import main

sys.exit(main())
