"""``python -m autoannot ...``: the ``autoannot`` command (see ``autoannot --help``)."""

import sys

from autoannot.cli import main

sys.exit(main())
