"""``python -m pytest_loops`` is the ``pytest-loops`` command."""

import sys

from pytest_loops.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
