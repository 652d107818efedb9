"""``python -m autoannot ...``: the ``autoannot`` command (see ``autoannot --help``)."""

import sys

from autoannot.cli import main

if __name__ == "__main__":  # (not when a worker process re-imports the main module: spawn)
    sys.exit(main())
