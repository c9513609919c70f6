"""Where the bug is likely to be: coverage spectra, suspects, affected tests."""
