"""One-off studies behind the defaults (run from a clone: python -m studies.NAME); not installed."""
