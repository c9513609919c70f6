"""Is the loop getting anywhere: the state fingerprint, the change journal, failure signatures."""
