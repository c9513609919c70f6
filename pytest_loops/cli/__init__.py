"""The ``pytest-loops`` command: run, show, diff, verify, selftest, demo."""
