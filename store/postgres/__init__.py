"""The PostgreSQL store: one database shared by several serving nodes (``--store URL``), behind the
same protocols as ``store/duckdb/`` (store/backend.py); ``kind.py`` is its ``SharedBackend``, reached
through store/opening.py only. psycopg comes with the ``postgres`` extra."""
