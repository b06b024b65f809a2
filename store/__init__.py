"""DuckDB source of truth: schema, lifecycle engine, journal, idempotency, encryption, admission policy."""
