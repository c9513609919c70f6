"""``python -m pytest_loops`` is the ``pytest-loops`` command."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
