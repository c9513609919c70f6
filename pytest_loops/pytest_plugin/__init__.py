"""The pytest side: options, the ``--loop`` session, the fix-loop, loop files as items, terminal output."""
