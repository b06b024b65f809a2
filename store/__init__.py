"""The source of truth: the engine and lifecycle, journal, idempotency, encryption, the admission policy and
its secrets screen, host operations and maintenance, over two backends behind ``store/backend.py``
(``store/duckdb/``, the embedded default; ``store/postgres/``, one database shared by several nodes)."""
