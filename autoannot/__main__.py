"""``python -m autoannot ...``: the ``autoannot`` command (see ``autoannot --help``)."""

from autoannot.cli import run

if __name__ == "__main__":  # (not when a worker process re-imports the main module: spawn)
    run()
