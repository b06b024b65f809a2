"""The DuckDB backend of the store boundary (store/backend.py): every SQL statement lives here."""
