"""The DuckDB backend of the store boundary (store/backend.py), the default: every SQL statement
on a DuckDB store lives here; ``kind.py`` is its ``EmbeddedBackend``, reached through
store/opening.py only."""
