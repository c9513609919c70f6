"""The loop itself: guards, checks, the revise step, the hooks, the engine."""
