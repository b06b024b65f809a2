"""The PostgreSQL store: one database shared by several serving nodes (``--store URL``), the same
protocols as ``store/duckdb/``; psycopg comes with the ``postgres`` extra."""
